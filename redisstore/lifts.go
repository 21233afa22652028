package redisstore

import (
	"context"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file keeps the denial caches of every process exact when a key's
// state moves the other way: a refund, an override set or deleted, or a
// reset can let a denied request pass before its retry-after. After such
// a change, the Store that made it publishes the key on liftsChannel; every
// Store with a denial cache subscribes, drops the key's cached denial, and
// acknowledges by pushing to the list the message names. The changing
// Store waits for as many acknowledgements as PUBLISH counted receivers,
// at most LiftWait, so that when the change returns, no process answers
// the key from a denial cached before it. A Store answers from its cache
// only while it is subscribed: when the subscription is lost, the cache
// is emptied and stays unused until Redis confirms it again, since the
// changes made meanwhile were not heard.

// liftsChannel is the channel of the lifts. A message is "<ack list>
// <base>", where base starts every Redis key of the key's limits,
// "<prefix>{key}:".
const liftsChannel = "floodgate:lifts"

// The ack lists' names: a refund's says so, as it ends no lease (a refund
// takes nothing a lease holds back), where a reset or an override ends
// the key's leases in every process.
const (
	liftAck   = "floodgate:lifts:ack:"
	refundAck = "floodgate:lifts:ack:r:"
)

// liftRetry is how long the listener waits before it tries again after
// losing its subscription.
const liftRetry = 100 * time.Millisecond

// LiftWait bounds how long a refund, an override or a reset waits for
// the other processes' denial caches to drop the key. A process that has
// not answered by then is slow or gone; its cache may answer the key from
// a denial for a moment longer.
const LiftWait = 250 * time.Millisecond

// lift tells every denial cache (and, but for a refund, every lease) that
// the key whose Redis keys start with base changed, and waits until they have dropped it (see the file's
// comment). It costs one round trip when no Store listens. It never fails
// the change that called it, which is made: a listener that does not
// answer within LiftWait (one closing, or cut off) is not waited for.
func (s *Store) lift(ctx context.Context, base string, refund bool) {
	ack := liftAck + strconv.FormatUint(rand.Uint64(), 36)
	if refund {
		ack = refundAck + strconv.FormatUint(rand.Uint64(), 36)
	}
	n, err := s.client.Publish(ctx, liftsChannel, ack+" "+base).Result()
	if err != nil || n == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, LiftWait)
	defer cancel()
	wait := strconv.FormatFloat(LiftWait.Seconds(), 'f', 3, 64)
	for ; n > 0; n-- {
		// BLPOP with a timeout in fractions of a second, which go-redis's
		// BLPop would round up to one.
		if err := s.client.Do(ctx, "BLPOP", ack, wait).Err(); err != nil {
			return
		}
	}
}

// listenLifts subscribes to the lifts and drops the cached denials they
// name, until stop is closed. It closes done when it returns.
func (s *Store) listenLifts(ps *redis.PubSub, stop, done chan struct{}) {
	defer close(done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-stop
		cancel()
		ps.Close()
	}()
	for {
		msg, err := ps.Receive(ctx)
		if err != nil {
			if s.denials != nil {
				s.denials.down()
			}
			select {
			case <-stop:
				return
			case <-time.After(liftRetry):
			}
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && s.denials != nil {
				s.denials.up()
			}
		case *redis.Message:
			ack, base, ok := strings.Cut(m.Payload, " ")
			if !ok {
				continue
			}
			if key, ok := s.keyOfBase(base); ok {
				if s.denials != nil {
					s.denials.forget(key)
				}
				if s.leases != nil && !strings.HasPrefix(ack, refundAck) {
					s.leases.forget(key)
				}
			}
			// Every listener answers, whatever its prefix: PUBLISH counted
			// it.
			s.client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
				pipe.RPush(ctx, ack, 1)
				pipe.Expire(ctx, ack, 10*time.Second)
				return nil
			})
		}
	}
}

// keyOfBase returns the key whose Redis keys start with base,
// "<prefix>{key}:", and false for another prefix's.
func (s *Store) keyOfBase(base string) (string, bool) {
	if !strings.HasPrefix(base, s.prefix) {
		return "", false
	}
	return s.keyOfOverride(base + "o")
}
