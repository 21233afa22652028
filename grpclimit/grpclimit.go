// Package grpclimit rate limits gRPC calls with a floodgate.Limiter.
//
// The server interceptors (unary and stream) deny a call over the limit
// with codes.ResourceExhausted, a RetryInfo detail saying when to retry
// and a QuotaFailure detail naming the violated policy, and they send the
// same information as response header metadata on every call:
// ratelimit-policy and ratelimit (the values of the HTTP header fields of
// package httplimit) and, on a denial, retry-after in whole seconds.
//
// The client interceptors (configured by ClientOptions, as the server's are
// by Options) wait for capacity before sending, so that a client keeps
// itself under a limit instead of being denied.
//
//	lim, _ := floodgate.New(floodgate.PerSecond(100))
//	srv := grpc.NewServer(
//		grpc.UnaryInterceptor(grpclimit.UnaryServerInterceptor(lim, nil)),
//		grpc.StreamInterceptor(grpclimit.StreamServerInterceptor(lim, nil)),
//	)
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/lib/clientip"
	"github.com/floodgate/floodgate/internal/lib/headers"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The metadata keys of the server's response headers.
const (
	MDPolicy     = "ratelimit-policy"
	MDRateLimit  = "ratelimit"
	MDRetryAfter = "retry-after"
)

// KeyFunc returns the rate limit key of a call to fullMethod
// ("/package.Service/Method"), for the server interceptors (Options.Key)
// and the client ones (ClientOptions.Key). An error fails the call with
// codes.InvalidArgument.
type KeyFunc func(ctx context.Context, fullMethod string) (string, error)

// PeerIP returns a KeyFunc that keys calls by the IP address of the
// connection's peer, as httplimit.IPKey spells it (IPv6 by its /64).
func PeerIP() KeyFunc {
	return func(ctx context.Context, _ string) (string, error) {
		a, err := peerAddr(ctx)
		if err != nil {
			return "", err
		}
		return clientip.Key(a), nil
	}
}

// ClientIP returns a KeyFunc that keys calls by the client's IP address
// behind trusted proxies (Envoy, a gRPC-aware load balancer), as
// httplimit.ClientIPFromHeader does for HTTP: the peer is the client
// unless it is trusted, and then only the request metadata named header
// ("x-forwarded-for", "forwarded" or "x-real-ip", as the proxies write
// it; X-Forwarded-For when empty) is read, walked from the nearest hop
// back. It fails for any other header.
func ClientIP(header string, trusted ...netip.Prefix) (KeyFunc, error) {
	res, err := clientip.New(header, trusted)
	if err != nil {
		return nil, fmt.Errorf("grpclimit: %w", err)
	}
	name := strings.ToLower(res.Header())
	return func(ctx context.Context, _ string) (string, error) {
		a, err := peerAddr(ctx)
		if err != nil {
			return "", err
		}
		md, _ := metadata.FromIncomingContext(ctx)
		return clientip.Key(res.Client(a, md.Get(name))), nil
	}, nil
}

// peerAddr returns the IP address of the call's peer.
func peerAddr(ctx context.Context) (netip.Addr, error) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return netip.Addr{}, errors.New("grpclimit: the call has no peer address")
	}
	a, err := clientip.ParseHost(p.Addr.String())
	if err != nil {
		return netip.Addr{}, fmt.Errorf("grpclimit: peer address %q: %w", p.Addr, err)
	}
	return a, nil
}

// Metadata returns a KeyFunc that keys calls by the first value of the
// request metadata key name (an API key, a tenant), as "<name>:<value>".
// A call without it is keyed by otherwise, or fails with
// codes.InvalidArgument when otherwise is nil.
func Metadata(name string, otherwise KeyFunc) KeyFunc {
	return func(ctx context.Context, method string) (string, error) {
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			if v := md.Get(name); len(v) > 0 && v[0] != "" {
				return name + ":" + v[0], nil
			}
		}
		if otherwise != nil {
			return otherwise(ctx, method)
		}
		return "", fmt.Errorf("grpclimit: metadata %q is missing", name)
	}
}

// Options configures the server interceptors. The zero value (or nil)
// gives the defaults.
type Options struct {
	// Key returns a call's key. Default: PeerIP().
	Key KeyFunc
	// Cost returns a call's cost. Default: 1.
	Cost func(ctx context.Context, fullMethod string) int64
	// Skip, when it returns true, lets a call through unlimited (health
	// checks, reflection).
	Skip func(ctx context.Context, fullMethod string) bool
	// FailClosed fails calls with codes.Unavailable when the limiter's
	// store fails. Default: false, the call is served unlimited. Either way
	// the error is logged.
	FailClosed bool
	// Logger receives store failures, a line a second at most, counting
	// those held back ("suppressed"), as a failing store fails every
	// call. Default: slog.Default().
	Logger *slog.Logger
}

type server struct {
	lim    *floodgate.Limiter
	count  int     // how many limits lim applies
	policy string  // the ratelimit-policy metadata value
	o      Options // its Key, Skip, FailClosed and Logger are in gate
	gate
}

func newServer(lim *floodgate.Limiter, opts *Options) *server {
	limits := lim.Limits()
	s := &server{lim: lim, count: len(limits), policy: headers.Policy(limits)}
	if opts != nil {
		s.o = *opts
	}
	s.gate = newGate(s.o.Key, s.o.Skip, s.o.FailClosed, s.o.Logger, "rate", "serving unlimited")
	return s
}

// decide returns the header metadata to send and nil when the call may
// proceed, or the status error to fail it with.
func (s *server) decide(ctx context.Context, method string) (metadata.MD, error) {
	key, ok, err := s.begin(ctx, method)
	if !ok {
		return nil, err
	}
	cost := int64(1)
	if s.o.Cost != nil {
		cost = s.o.Cost(ctx, method)
	}
	res, err := s.lim.AllowN(ctx, key, cost)
	if err != nil {
		return nil, s.failed(err, method)
	}
	md := metadata.Pairs(MDPolicy, s.policy, MDRateLimit, headers.RateLimit(res, s.count))
	if res.Allowed {
		return md, nil
	}
	policy := headers.Name(res.Name, res.Index, s.count)
	var st *status.Status
	if res.RetryAfter == floodgate.Never {
		st = status.New(codes.ResourceExhausted, fmt.Sprintf("cost %d is more than rate limit policy %q admits at once (%d); it can never be allowed", cost, policy, res.Quota))
	} else {
		md.Set(MDRetryAfter, strconv.FormatInt(headers.Seconds(res.RetryAfter), 10))
		st = status.New(codes.ResourceExhausted, fmt.Sprintf("rate limit policy %q exceeded; retry in %s", policy, res.RetryAfter))
		st, _ = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(res.RetryAfter)})
	}
	st, _ = st.WithDetails(&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: key, Description: policy}}})
	return md, st.Err()
}

// UnaryServerInterceptor returns a unary server interceptor that limits
// calls with lim.
func UnaryServerInterceptor(lim *floodgate.Limiter, opts *Options) grpc.UnaryServerInterceptor {
	s := newServer(lim, opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, err := s.decide(ctx, info.FullMethod)
		if md != nil {
			grpc.SetHeader(ctx, md)
		}
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor returns a stream server interceptor that limits
// the opening of streams with lim: one decision per stream.
func StreamServerInterceptor(lim *floodgate.Limiter, opts *Options) grpc.StreamServerInterceptor {
	s := newServer(lim, opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		md, err := s.decide(ss.Context(), info.FullMethod)
		if md != nil {
			ss.SetHeader(md)
		}
		if err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// ByMethod returns a KeyFunc that keys calls by their method
// ("/package.Service/Method"), so that each method has its own limit: on
// a client, to keep each method under its own limit; on a server, to
// limit a method for all callers together.
func ByMethod() KeyFunc {
	return func(_ context.Context, fullMethod string) (string, error) { return fullMethod, nil }
}

// ClientOptions configures the client interceptors, as Options does the
// server's. The zero value (or nil) gives the defaults.
type ClientOptions struct {
	// Key returns the key under which a call is limited; an error fails
	// the call with codes.InvalidArgument, unsent. Default: every call
	// under the one key "grpc-client".
	Key KeyFunc
}

// UnaryClientInterceptor returns a client interceptor that waits, with
// lim.Wait, until a call fits lim before sending it. A call whose context
// ends first fails with the context's status (codes.DeadlineExceeded when
// the deadline would pass before capacity), without being sent.
func UnaryClientInterceptor(lim *floodgate.Limiter, opts *ClientOptions) grpc.UnaryClientInterceptor {
	key := clientKey(opts)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if err := wait(ctx, lim, key, method); err != nil {
			return err
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// StreamClientInterceptor is UnaryClientInterceptor for the opening of
// streams.
func StreamClientInterceptor(lim *floodgate.Limiter, opts *ClientOptions) grpc.StreamClientInterceptor {
	key := clientKey(opts)
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if err := wait(ctx, lim, key, method); err != nil {
			return nil, err
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
}

// clientKey returns opts's Key, or nil for the one default key.
func clientKey(opts *ClientOptions) KeyFunc {
	if opts == nil {
		return nil
	}
	return opts.Key
}

// wait waits until a call to method fits lim, and returns the status
// error to fail it with otherwise.
func wait(ctx context.Context, lim *floodgate.Limiter, key KeyFunc, method string) error {
	k := "grpc-client"
	if key != nil {
		var err error
		if k, err = key(ctx, method); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
	}
	err := lim.Wait(ctx, k)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, floodgate.ErrDeadline):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case errors.Is(err, floodgate.ErrCostTooHigh):
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}
