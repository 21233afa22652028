package floodgate_test

import (
	"testing"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/storetest"
)

func TestMemoryStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clock floodgate.Clock) floodgate.Store {
		return floodgate.NewMemoryStore(&floodgate.MemoryOptions{Clock: clock, SweepInterval: -1})
	})
}
