package redisstore

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Cause returns the last error that Redis's connections gave since a
// command last succeeded: a refused or timed-out dial, a bad certificate,
// a WRONGPASS at the connection's AUTH, LOADING and the like; nil once a
// command succeeds. A call that runs out of time while the client retries
// returns only the context's error; the fallback store logs this instead,
// the reason that time went by. Errors about one key (floodgate.ErrKey)
// and the callers' own context errors are not recorded.
func (s *Store) Cause() error {
	if p := s.cause.Load(); p != nil {
		return *p
	}
	return nil
}

// note records err, a Redis call's outcome, for Cause.
func (s *Store) note(err error) {
	switch {
	case err == nil, errors.Is(err, redis.Nil):
		if s.cause.Load() != nil {
			s.cause.Store(nil)
		}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
	case strings.HasPrefix(err.Error(), "FLOODGATE "):
		// The scripts' own answers: about a key, or one the client
		// expects (a rebase's "overridden"); not the server failing.
	default:
		if _, ok := keyFailure(err.Error()); !ok {
			// A copy, so that only this branch moves an error to the
			// heap, not every call's parameter (BenchmarkOverride's allocs).
			cause := err
			s.cause.Store(&cause)
		}
	}
}

// causeHook is the go-redis hook through which a Store sees its client's
// errors for Cause.
type causeHook struct{ s *Store }

func (h causeHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil && !h.s.closed.Load() {
			h.s.note(err)
		}
		return c, err
	}
}

func (h causeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if !h.s.closed.Load() {
			h.s.note(err)
		}
		return err
	}
}

func (h causeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if !h.s.closed.Load() {
			h.s.note(err)
		}
		return err
	}
}

// watch adds the Store's causeHook to client: on a Cluster to each node's
// client as well, where the dials happen.
func (s *Store) watch(client redis.UniversalClient) {
	if client == nil {
		return // a Store that only prepares policies, as unit tests build
	}
	h := causeHook{s}
	client.AddHook(h)
	if cc, ok := client.(*redis.ClusterClient); ok {
		cc.OnNewNode(func(n *redis.Client) { n.AddHook(dialOnly{h}) })
	}
}

// dialOnly is a causeHook that sees dials only: a Cluster's commands pass
// its own hook already.
type dialOnly struct{ causeHook }

func (dialOnly) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (dialOnly) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
