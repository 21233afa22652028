package main

import (
	"regexp"
	"runtime/debug"
	"strings"
	"time"
)

// version is the release's version, stamped by a release or image build
// with -ldflags "-X main.version=v1.2.3". Empty by default: the version
// then comes from the module's build information.
var version = ""

// getVersion returns floodgate's version alone: the stamped one, the
// module's when it was built as a dependency at a version (go install
// ...@v1.0.0), or "devel" when built from a checkout.
func getVersion() string {
	bi, _ := debug.ReadBuildInfo()
	return buildVersion(version, bi)
}

// versionLine returns what floodgate version prints after "floodgate ":
// the version and, when the build recorded them, the commit, its date and
// whether the tree had uncommitted changes, like
// "v1.0.0 (rev e2be27c, 2026-11-28, modified)".
func versionLine() string {
	bi, _ := debug.ReadBuildInfo()
	return describeBuild(version, bi)
}

// untagged matches the pseudo-version that go build gives a checkout with
// no release tag behind it (+dirty already removed): it names no release,
// so it reads as devel, and the revision says which commit it is.
var untagged = regexp.MustCompile(`^v0\.0\.0-\d{14}-[0-9a-f]{12}$`)

// buildVersion returns stamp, or the main module's version in bi, or
// "devel" when neither names a release.
func buildVersion(stamp string, bi *debug.BuildInfo) string {
	if stamp = strings.TrimSpace(stamp); stamp != "" {
		return stamp
	}
	if bi == nil {
		return "devel"
	}
	// +dirty repeats vcs.modified, which the revision part reports.
	v := strings.TrimSuffix(bi.Main.Version, "+dirty")
	if v == "" || v == "(devel)" || untagged.MatchString(v) {
		return "devel"
	}
	return v
}

// describeBuild returns buildVersion(stamp, bi) followed by the VCS
// revision, date and modified flag that bi records, if any.
func describeBuild(stamp string, bi *debug.BuildInfo) string {
	v := buildVersion(stamp, bi)
	if bi == nil {
		return v
	}
	var rev, at string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		return v
	}
	parts := []string{"rev " + rev[:min(7, len(rev))]}
	if t, err := time.Parse(time.RFC3339, at); err == nil {
		parts = append(parts, t.UTC().Format(time.DateOnly))
	}
	if modified {
		parts = append(parts, "modified")
	}
	return v + " (" + strings.Join(parts, ", ") + ")"
}
