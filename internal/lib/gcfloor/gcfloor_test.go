package gcfloor

import (
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name        string
		live, floor uint64
		want        int
	}{
		{"live above the floor: Go's default", 100 * mib, 64 * mib, 100},
		{"live at the floor", 64 * mib, 64 * mib, 100},
		{"live half the floor", 32 * mib, 64 * mib, 200},
		{"small live heap", 5 * mib, 64 * mib, 1280},
		// 64 MiB / 1 MiB would be 6400, whose scaled minimum heap goal
		// (256 MiB) is far past live+floor: 65 MiB is 1625% of 4 MiB.
		{"tiny live heap: the runtime's minimum caps it", 1 * mib, 64 * mib, 1625},
		{"no live heap yet", 0, 64 * mib, 1600},
		{"floor below the minimum heap", 1 * mib, 2 * mib, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percent(tc.live, tc.floor); got != tc.want {
				t.Errorf("Percent(%d, %d) = %d, want %d", tc.live, tc.floor, got, tc.want)
			}
		})
	}
}

func gogc(t *testing.T) int {
	t.Helper()
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

func TestStartStop(t *testing.T) {
	t.Setenv("GOGC", "")
	adjusted := make(chan int, 1)
	f := start(64<<20, func(p int) {
		select {
		case adjusted <- p:
		default:
		}
	})
	if f == nil {
		t.Fatal("start returned nil with GOGC unset")
	}
	if again := Start(64 << 20); again != nil {
		again.Stop()
		t.Fatal("a second Floor started while one runs")
	}
	if got := gogc(t); got <= 100 {
		t.Errorf("GC percent %d after Start, want more than 100 for this test's small heap", got)
	}
	// The finalizer runs after a collection, on the runtime's finalizer
	// goroutine, and sets the percent for the heap it left.
	runtime.GC()
	select {
	case p := <-adjusted:
		if p <= 100 {
			t.Errorf("adjusted to %d, want more than 100", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no adjustment within 10s of a collection")
	}
	f.Stop()
	f.Stop() // safe twice
	if got := gogc(t); got != 100 {
		t.Errorf("GC percent %d after Stop, want 100 restored", got)
	}
	// After Stop the armed finalizer changes nothing.
	runtime.GC()
	runtime.GC()
	if got := gogc(t); got != 100 {
		t.Errorf("GC percent %d after Stop and two collections, want 100", got)
	}
	// Stopped, a new Floor may start.
	g := Start(64 << 20)
	if g == nil {
		t.Fatal("Start after Stop returned nil")
	}
	g.Stop()
}

func TestOff(t *testing.T) {
	for _, tc := range []struct {
		name, gogc string
		floor      uint64
	}{
		{"GOGC set by the operator", "200", 64 << 20},
		{"GOGC off", "off", 64 << 20},
		{"floor 0", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOGC", tc.gogc)
			f := Start(tc.floor)
			if f != nil {
				f.Stop()
				t.Fatal("Start returned a Floor, want nil")
			}
			var nilFloor *Floor
			nilFloor.Stop() // does nothing
			if got := gogc(t); got != 100 {
				t.Errorf("GC percent %d, want 100 unchanged", got)
			}
		})
	}
}
