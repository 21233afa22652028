package floodgate_test

import (
	"testing"
	"unsafe"

	"github.com/floodgate/floodgate"
)

// A Result is 64 bytes on 64-bit platforms: its three one-byte fields
// come first and share a word. Every decision returns one by value,
// through memory, and a Result of 72 bytes, with Allowed alone in the
// first word, was copied in five 16-byte moves of which the last
// overlapped the fourth, so that reading a Result just written waited
// for both stores, which slowed every decision of the memory store
// (BenchmarkMemoryVsXTimeRate in bench/ guards it).
func TestResultSize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the layout is measured on 64-bit platforms")
	}
	if got := unsafe.Sizeof(floodgate.Result{}); got != 64 {
		t.Errorf("Result is %d bytes, want 64", got)
	}
}
