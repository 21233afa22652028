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
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range tries {
				if err := f(w, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
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
