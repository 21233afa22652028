package main

import (
	"debug/buildinfo"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

// TestDescribeBuild: what floodgate version prints for each kind of build.
func TestDescribeBuild(t *testing.T) {
	vcs := func(rev, at, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.time", Value: at}, {Key: "vcs.modified", Value: modified}}
	}
	const rev = "e2be27c0123456789abcdef0123456789abcdef0"
	tests := []struct {
		name  string
		stamp string
		main  string
		set   []debug.BuildSetting
		want  string
	}{
		{"no build information", "", "", nil, "devel"},
		{"a checkout without VCS stamps", "", "(devel)", nil, "devel"},
		{"a checkout, clean", "", "v0.0.0-20261128191705-e2be27c01234", vcs(rev, "2026-11-28T19:17:05Z", "false"), "devel (rev e2be27c, 2026-11-28)"},
		{"a checkout with changes", "", "v0.0.0-20261128191705-e2be27c01234+dirty", vcs(rev, "2026-11-28T19:17:05Z", "true"), "devel (rev e2be27c, 2026-11-28, modified)"},
		{"go -buildvcs=false in a checkout", "", "(devel)", nil, "devel"},
		{"a tag", "", "v1.0.0", vcs(rev, "2026-11-28T19:17:05Z", "false"), "v1.0.0 (rev e2be27c, 2026-11-28)"},
		{"commits after a tag", "", "v1.0.1-0.20261128191705-e2be27c01234", vcs(rev, "2026-11-28T19:17:05Z", "false"), "v1.0.1-0.20261128191705-e2be27c01234 (rev e2be27c, 2026-11-28)"},
		{"go install @v1.0.0: no VCS stamps", "", "v1.0.0", nil, "v1.0.0"},
		{"stamped with -X, in a modified checkout", "v1.0.0", "(devel)", vcs(rev, "2026-11-28T23:59:59-05:00", "true"), "v1.0.0 (rev e2be27c, 2026-11-29, modified)"},
		{"stamped with -X, no VCS", "v1.2.3-rc.1", "(devel)", nil, "v1.2.3-rc.1"},
		{"an unreadable VCS time is left out", "", "(devel)", vcs(rev, "yesterday", "false"), "devel (rev e2be27c)"},
		{"a short revision", "", "(devel)", vcs("abc", "", ""), "devel (rev abc)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var bi *debug.BuildInfo
			if tt.main != "" {
				bi = &debug.BuildInfo{Main: debug.Module{Path: "github.com/floodgate/floodgate", Version: tt.main}, Settings: tt.set}
			}
			if got := describeBuild(tt.stamp, bi); got != tt.want {
				t.Errorf("describeBuild = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestVersionCommand builds the command with and without a version
// stamped by -ldflags, and checks that version and --version print it with
// what the build recorded of the commit.
func TestVersionCommand(t *testing.T) {
	stamped := filepath.Join(t.TempDir(), "floodgate")
	// -buildvcs=auto: record the commit when this is a checkout, whatever
	// $GOFLAGS says, as a release build would.
	build := exec.Command("go", "build", "-buildvcs=auto", "-ldflags", "-X main.version=v9.8.7", "-o", stamped, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -ldflags -X main.version=v9.8.7: %v\n%s", err, out)
	}
	for _, tt := range []struct {
		name, bin, version string
	}{
		{"-X main.version=v9.8.7", stamped, "v9.8.7"},
		{"no stamp", binary, ""}, // TestMain's build
	} {
		t.Run(tt.name, func(t *testing.T) {
			bi, err := buildinfo.ReadFile(tt.bin)
			if err != nil {
				t.Fatal(err)
			}
			want := "floodgate " + describeBuild(tt.version, bi) + "\n"
			if tt.version != "" && !strings.HasPrefix(want, "floodgate v9.8.7") {
				t.Fatalf("the expectation itself is wrong: %q", want)
			}
			for _, arg := range []string{"version", "--version"} {
				out, err := exec.Command(tt.bin, arg).Output()
				if err != nil {
					t.Fatalf("floodgate %s: %v", arg, err)
				}
				if string(out) != want {
					t.Errorf("floodgate %s = %q, want %q", arg, out, want)
				}
			}
			t.Logf("%s", want)
		})
	}
}
