package fallback

import (
	"context"
	"errors"
)

// This file is what a Store reports about the primary's failures: its
// counters, the primary's cause, and the log lines about one key.

// Stats are a Store's counters since New.
type Stats struct {
	Failures  uint64 // primary calls that failed or exceeded the budget
	Fallbacks uint64 // decisions answered by the mode rather than the primary
	Switches  uint64 // breaker state changes, both ways
	Probes    uint64 // probe calls made while degraded
	// Settled counts the units charged to the primary when it came back,
	// for what the local limiter admitted; Unsettled, the local
	// admissions on keys that could not be settled (more than
	// MaxLedgerKeys keys in one outage, or a primary that cannot charge).
	Settled, Unsettled uint64
	// KeyErrors counts the primary's errors about one key
	// (floodgate.ErrKey: foreign data at its Redis keys, an ACL's
	// refusal), which never count as failures: the decision's caller gets
	// the error, and a key of the ledger that fails so is dropped from it
	// unsettled, so that it cannot hold the breaker open.
	KeyErrors uint64
}

// Stats returns the Store's counters.
func (s *Store) Stats() Stats {
	return Stats{
		Failures:  s.stats.failures.Load(),
		Fallbacks: s.stats.fallbacks.Load(),
		Switches:  s.stats.switches.Load(),
		Probes:    s.stats.probes.Load(),
		Settled:   s.stats.settled.Load(),
		Unsettled: s.stats.unsettled.Load(),
		KeyErrors: s.stats.keyErrors.Load(),
	}
}

// Causer is a primary store that can say why its calls fail when all a
// call saw was its deadline: redisstore.Store keeps its connections' last
// error (a refused dial, a bad certificate, a WRONGPASS).
type Causer interface {
	// Cause returns the store's last underlying error since a success,
	// or nil.
	Cause() error
}

// Cause returns why the primary store's calls fail, as the primary tells
// (see Causer): its last underlying error since a success; nil when it
// cannot tell or when its last call succeeded.
func (s *Store) Cause() error {
	if c, ok := s.primary.(Causer); ok {
		return c.Cause()
	}
	return nil
}

// cause returns why err, a primary's failure that is only a context's
// error (the budget ran out), happened, as the primary tells: the error
// that the switch log names. It returns nil when err says more itself, or
// when the primary cannot tell.
func (s *Store) cause(err error) error {
	c, ok := s.primary.(Causer)
	if !ok || !(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return nil
	}
	return c.Cause()
}

// logKeyError logs an error about one key (floodgate.ErrKey), at most
// once a second, with how many were held back.
func (s *Store) logKeyError(msg, key string, err error) {
	if held, ok := s.keyLog.Allow(); ok {
		s.log.Warn(msg, "key", key, "error", err.Error(), "suppressed", held)
	}
}
