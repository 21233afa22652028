package floodgate_test

import (
	"testing"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/storetest"
)

// oneByOne hides the memory store's TakeGroup, so that AllowGroup decides
// one request after another and undoes a group with refunds.
type oneByOne struct{ floodgate.Store }

// TestAllowGroupOneByOne holds AllowGroup's path for stores that cannot
// decide a group at once to the same scenarios.
func TestAllowGroupOneByOne(t *testing.T) {
	for _, sc := range storetest.GroupScenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			storetest.RunGroupScenario(t, func(t *testing.T, clock floodgate.Clock) floodgate.Store {
				return oneByOne{floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})}
			}, sc)
		})
	}
}
