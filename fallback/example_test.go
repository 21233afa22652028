package fallback_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/fallback"
)

// A fallback store in front of a shared store. Here the primary is an
// in-memory store so that the example runs anywhere; in production it is
// a redisstore.Store.
func ExampleNew() {
	primary := floodgate.NewMemoryStore(nil)
	defer primary.Close()

	store := fallback.New(primary, &fallback.Options{
		Mode:      fallback.Local, // the default: answer from a local limiter
		Instances: 4,              // each process gets a quarter of each limit
		Budget:    20 * time.Millisecond,
		Logger:    slog.Default(),
		OnSwitch:  func(s fallback.State) { fmt.Println("now", s) },
	})
	defer store.Close()

	limiter, _ := floodgate.NewLimiter(store, []floodgate.Limit{floodgate.PerMinute(100)}, nil)
	r, _ := limiter.Allow(context.Background(), "user:42")
	fmt.Println(r.Allowed, r.Remaining, r.Source)
	// Output: true 99 store
}
