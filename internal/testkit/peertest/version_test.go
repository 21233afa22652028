package peertest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// gitRepo makes a git repository in a new directory with a commit tagged
// v1.4.0 and, when after, a commit after it; both at fixed times. It
// returns the directory and the full hash of HEAD.
func gitRepo(t *testing.T, tag string, after bool) (string, string) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	dir := t.TempDir()
	run := func(date string, args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_DATE="+date, "GIT_COMMITTER_DATE="+date, "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run("", "init", "-q")
	write(t, dir, "go.mod", "module example.com/x\n")
	run("", "add", "go.mod")
	run("2026-01-02T03:04:05Z", "commit", "-q", "-m", "one")
	if tag != "" {
		run("", "tag", tag)
	}
	if after {
		write(t, dir, "a.go", "package x\n")
		run("", "add", "a.go")
		// +02:00: the pseudo-version's time is UTC.
		run("2026-07-06T08:52:34+02:00", "commit", "-q", "-m", "two")
	}
	return dir, run("", "rev-parse", "HEAD")
}

func write(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestResolveVersion(t *testing.T) {
	plain := t.TempDir() // a copy without .git
	for _, tc := range []struct {
		name string
		repo func(t *testing.T) (src, head string)
		env  string // VersionEnv; "HEAD" is replaced by a pseudo-version of the repo's HEAD
		want string // "HEAD" as in env; "" wants an error
		err  string // in the error
	}{
		{name: "default", want: RatelimitVersion},
		{name: "version only", env: "v1.4.1-0.20260706065234-f2fb15770f7f", want: "v1.4.1-0.20260706065234-f2fb15770f7f"},
		{name: "a tag", env: "v1.5.0", want: "v1.5.0"},
		{name: "not a version", env: "latest", err: VersionEnv},
		{name: "a path", env: "v1.0.0/../../x", err: VersionEnv},
		{name: "no patch", env: "v1.4", err: VersionEnv},
		{name: "copy without .git", repo: func(*testing.T) (string, string) { return plain, "" }, err: VersionEnv},
		{name: "copy without .git and a version", repo: func(*testing.T) (string, string) { return plain, "" },
			env: "v1.4.1-0.20260706065234-f2fb15770f7f", want: "v1.4.1-0.20260706065234-f2fb15770f7f"},
		{name: "checkout after a tag", repo: func(t *testing.T) (string, string) { return gitRepo(t, "v1.4.0", true) }, want: "HEAD"},
		{name: "checkout after a pre-release", repo: func(t *testing.T) (string, string) { return gitRepo(t, "v2.0.0-rc.1", true) },
			want: "v2.0.0-rc.1.0.20260706065234-"},
		{name: "checkout at a tag", repo: func(t *testing.T) (string, string) { return gitRepo(t, "v1.4.0", false) }, want: "v1.4.0"},
		{name: "checkout without tags", repo: func(t *testing.T) (string, string) { return gitRepo(t, "", true) }, err: "no version tag"},
		{name: "checkout and its version", repo: func(t *testing.T) (string, string) { return gitRepo(t, "v1.4.0", true) }, env: "HEAD", want: "HEAD"},
		{name: "checkout and another commit's version", repo: func(t *testing.T) (string, string) { return gitRepo(t, "v1.4.0", true) },
			env: "v1.4.1-0.20260706065234-f2fb15770f7f", err: "names commit f2fb15770f7f"},
		{name: "checkout with changes", repo: func(t *testing.T) (string, string) {
			dir, head := gitRepo(t, "v1.4.0", true)
			write(t, dir, "a.go", "package x // changed\n")
			return dir, head
		}, err: "uncommitted changes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var src, head string
			if tc.repo != nil {
				src, head = tc.repo(t)
			}
			pseudo := "v1.4.1-0.20260706065234-" + head[:min(12, len(head))]
			env, want := tc.env, tc.want
			if env == "HEAD" {
				env = pseudo
			}
			if want == "HEAD" {
				want = pseudo
			}
			got, err := resolveVersion(src, env)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("resolveVersion(%q, %q) = %q, %v; want an error with %q", src, env, got, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("resolveVersion(%q, %q): %v", src, env, err)
			}
			if strings.HasSuffix(want, "-") { // the hash is the repo's
				want += head[:12]
			}
			if got != want {
				t.Errorf("resolveVersion(%q, %q) = %q, want %q", src, env, got, want)
			}
		})
	}
}
