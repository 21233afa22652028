package redisstore_test

import (
	"sync"
	"testing"
)

// hammer runs workers goroutines at once, each calling f(w, i) for i
// from 0 to tries-1, and waits for all of them: the load of the tests of
// concurrent callers. An error from f ends its worker; once all have
// stopped, every error is reported and the test stops.
func hammer(t *testing.T, workers, tries int, f func(w, i int) error) {
	t.Helper()
	goHammer(workers, func(i int) bool { return i < tries }, f)(t)
}

// goHammer is hammer while more(i) holds, started: it returns at once,
// and the function it returns waits for the workers and reports as
// hammer does. A load beside something the test does (a reshard) stops
// when more says so.
func goHammer(workers int, more func(i int) bool, f func(w, i int) error) (wait func(t *testing.T)) {
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; more(i); i++ {
				if err := f(w, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	return func(t *testing.T) {
		t.Helper()
		wg.Wait()
		close(errs)
		failed := false
		for err := range errs {
			t.Error(err)
			failed = true
		}
		if failed {
			t.FailNow()
		}
	}
}
