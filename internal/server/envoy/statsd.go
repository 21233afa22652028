package envoy

// envoyproxy/ratelimit's service and gRPC server statistics, for StatsD.

import (
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/internal/server/statsd"
)

// serviceStatsD are the statistics envoyproxy/ratelimit keeps beside the
// per-descriptor ones, under its names; all nil without a sink, and a nil
// counter or timer counts nothing.
type serviceStatsD struct {
	// totalRequests and responseTime are its gRPC server's, per call of
	// ShouldRateLimit (not /json, which its interceptor does not see).
	totalRequests *statsd.Counter
	responseTime  *statsd.Timer
	// redisError and serviceError are calls that failed: on the store,
	// or on bad input.
	redisError, serviceError *statsd.Counter
}

func newServiceStatsD(sink *statsd.Sink, svc *service.Service, globalShadow *atomic.Uint64) serviceStatsD {
	// The configuration loaded at start is a load too, as it is there.
	sink.CounterFunc("ratelimit.service.config_load_success", func() uint64 { ok, _ := svc.ReloadCount(); return ok + 1 })
	sink.CounterFunc("ratelimit.service.config_load_error", func() uint64 { _, failed := svc.ReloadCount(); return failed })
	if globalShadow != nil {
		sink.CounterFunc("ratelimit.service.global_shadow_mode", globalShadow.Load)
	}
	return serviceStatsD{
		totalRequests: sink.Counter("ratelimit_server.ShouldRateLimit.total_requests"),
		responseTime:  sink.Timer("ratelimit_server.ShouldRateLimit.response_time"),
		redisError:    sink.Counter("ratelimit.service.call.should_rate_limit.redis_error"),
		serviceError:  sink.Counter("ratelimit.service.call.should_rate_limit.service_error"),
	}
}

// call counts a gRPC call that started at start.
func (sd *serviceStatsD) call(start time.Time) {
	if sd.totalRequests == nil {
		return
	}
	sd.totalRequests.Add(1)
	sd.responseTime.Record(time.Since(start))
}

// validHeaderName reports whether h can name an HTTP header.
func validHeaderName(h string) bool { return httpguts.ValidHeaderFieldName(h) }
