package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestStampDirectory: a rules directory's stamp changes when a file comes,
// changes size or goes, in it or in a directory below it (which Load
// reads), and not for a file that Load skips.
func TestStampDirectory(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "team", "edge")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "a.yaml"), "domain: a\n")
	last := stamp(dir)
	for _, step := range []struct {
		name    string
		do      func()
		changed bool
	}{
		{"a file below comes", func() { writeFile(t, filepath.Join(sub, "e.yaml"), "domain: e\n") }, true},
		{"it grows", func() { writeFile(t, filepath.Join(sub, "e.yaml"), "domain: e\ndescriptors: []\n") }, true},
		{"a skipped file below comes", func() { writeFile(t, filepath.Join(sub, "notes.txt"), "x") }, false},
		{"the file below goes", func() { os.Remove(filepath.Join(sub, "e.yaml")) }, true},
	} {
		step.do()
		now := stamp(dir)
		// Modification times can be equal within the clock's resolution:
		// the sizes say it for these steps.
		if got := now.size != last.size; got != step.changed {
			t.Errorf("%s: stamp changed %v, want %v (%+v, then %+v)", step.name, got, step.changed, last, now)
		}
		last = now
	}
}
