package storetest

import (
	"slices"
	"sync"
	"time"

	"github.com/floodgate/floodgate"
)

// Arrival is one request of a Load: when it was sent, and its Result.
type Arrival struct {
	At     time.Time
	Result floodgate.Result
}

// Load sends requests from several goroutines, each at a fixed interval,
// and records every answer, for fault tests that compare what a store
// admitted under a fault with what an exact limiter admits (Compare).
type Load struct {
	mu       sync.Mutex
	arrivals []Arrival
	errs     []error
	stop     chan struct{}
	wg       sync.WaitGroup
}

// StartLoad starts callers goroutines that each call call every interval
// until Stop.
func StartLoad(callers int, interval time.Duration, call func() (floodgate.Result, error)) *Load {
	l := &Load{stop: make(chan struct{})}
	for range callers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				select {
				case <-l.stop:
					return
				case <-tick.C:
				}
				at := time.Now()
				r, err := call()
				l.mu.Lock()
				if err != nil {
					l.errs = append(l.errs, err)
				} else {
					l.arrivals = append(l.arrivals, Arrival{at, r})
				}
				l.mu.Unlock()
			}
		}()
	}
	return l
}

// Last returns the latest answer recorded, if any.
func (l *Load) Last() (Arrival, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.arrivals) == 0 {
		return Arrival{}, false
	}
	return l.arrivals[len(l.arrivals)-1], true
}

// Stop stops the callers, waits for them, and returns the answers in the
// order the requests were sent, and the errors.
func (l *Load) Stop() ([]Arrival, []error) {
	close(l.stop)
	l.wg.Wait()
	slices.SortFunc(l.arrivals, func(a, b Arrival) int { return a.At.Compare(b.At) })
	return l.arrivals, l.errs
}

// Compare replays arrivals, all on key, through an exact limiter (see
// Exact) with limits, and returns how many the store admitted, how many
// the exact limiter admits, and the most the store's admissions ran
// ahead of the exact limiter's at any moment.
func Compare(arrivals []Arrival, key string, limits ...floodgate.Limit) (admitted, exact, largestOver int, err error) {
	if len(arrivals) == 0 {
		return 0, 0, 0, nil
	}
	e, err := NewExact(arrivals[0].At, limits...)
	if err != nil {
		return 0, 0, 0, err
	}
	defer e.Close()
	for _, a := range arrivals {
		if a.Result.Allowed {
			admitted++
		}
		if e.Allow(key, a.At) {
			exact++
		}
		largestOver = max(largestOver, admitted-exact)
	}
	return admitted, exact, largestOver, nil
}
