package floodgate_test

import (
	"testing"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/storetest"
)

// FuzzSlots holds the memory store's concurrency limits to storetest's
// reference model on random sequences of acquires, releases, extends and
// clock steps.
func FuzzSlots(f *testing.F) {
	for _, seed := range slotSeeds {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		err := storetest.CheckSlotSequence(func(clock floodgate.Clock) floodgate.Store {
			return floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
		}, data)
		if err != nil {
			t.Fatal(err)
		}
	})
}

var slotSeeds = [][]byte{
	{2, 10, 0, 0, 8, 0, 0, 8, 0, 0, 8, 1, 0, 8, 2, 0, 20, 1, 1, 8},
	{0, 3, 0, 0, 8, 1, 0, 8, 1, 0, 8, 0, 0, 31, 2, 0, 0, 0, 0, 0},
	{4, 49, 0, 0, 8, 4, 0, 8, 8, 0, 8, 2, 1, 12, 0, 0, 30, 1, 2, 8, 0, 0, 0},
}
