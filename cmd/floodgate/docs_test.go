package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/testkit/redistest"
	"github.com/floodgate/floodgate/internal/testkit/syncbuf"
)

// TestDocs runs every shell command of README.md and docs/*.md and checks
// what it prints, so that the documentation cannot drift from the code.
// docs/design.md ("Commands in the docs") describes the conventions: which
// blocks run, how expected output is written, and what the test rewrites.
func TestDocs(t *testing.T) {
	for _, tool := range []string{"curl", "redis-cli"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("FLOODGATE_REQUIRE_REDIS") == "1" {
				t.Fatalf("%s not found: scripts/test installs it", tool)
			}
			t.Skipf("%s not found; skipping (scripts/test installs it)", tool)
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{filepath.Join(root, "README.md")}, files...)
	for _, path := range files {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		name, _ := filepath.Rel(root, path)
		blocks, err := parseDocBlocks(name, string(src))
		if err != nil {
			t.Fatal(err)
		}
		if len(blocks) == 0 {
			continue
		}
		// Each file runs on a fresh store: once on the memory store, and
		// again on a Redis when it starts a server.
		t.Run(name+"/memory", func(t *testing.T) { runDocBlocks(t, root, blocks, "") })
		if hasServe(blocks) {
			t.Run(name+"/redis", func(t *testing.T) {
				runDocBlocks(t, root, blocks, redistest.Start(t).Addr)
			})
		}
	}
}

// docCommand is one command of a shell block and the output it shows.
type docCommand struct {
	where string   // file:line
	line  string   // the command, continuation lines joined
	want  []string // expected output lines; nil when unchecked
}

// parseDocBlocks returns the commands of the ```sh and ```console blocks
// of a markdown file, skipping a block preceded by <!-- norun: why -->.
func parseDocBlocks(name, src string) ([]docCommand, error) {
	var cmds []docCommand
	lines := strings.Split(src, "\n")
	norun := false
	for i := 0; i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		switch {
		case strings.HasPrefix(l, "<!-- norun:"):
			norun = true
			continue
		case l == "":
			continue
		case !strings.HasPrefix(l, "```"):
			norun = false
			continue
		}
		lang := strings.TrimPrefix(l, "```")
		start := i
		var body []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			body = append(body, lines[i])
		}
		if i == len(lines) {
			return nil, fmt.Errorf("%s:%d: unterminated code block", name, start+1)
		}
		run := (lang == "sh" || lang == "console") && !norun
		norun = false
		if !run {
			continue
		}
		cmds = append(cmds, parseBlock(name, start+2, body)...)
	}
	return cmds, nil
}

// parseBlock splits a block into commands. In a block with "$ " prompts,
// the lines after a command up to the next prompt are its output; in one
// without, every line is a command whose output is not checked.
func parseBlock(name string, first int, body []string) []docCommand {
	prompts := false
	for _, l := range body {
		if strings.HasPrefix(strings.TrimSpace(l), "$ ") {
			prompts = true
		}
	}
	var cmds []docCommand
	for j := 0; j < len(body); j++ {
		l := strings.TrimSpace(body[j])
		if prompts && !strings.HasPrefix(l, "$ ") || l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		c := docCommand{where: fmt.Sprintf("%s:%d", name, first+j), line: strings.TrimPrefix(l, "$ ")}
		for strings.HasSuffix(c.line, "\\") && j+1 < len(body) {
			j++
			c.line = strings.TrimSuffix(c.line, "\\") + " " + strings.TrimSpace(body[j])
		}
		if prompts {
			c.want = []string{}
			for j+1 < len(body) && !strings.HasPrefix(strings.TrimSpace(body[j+1]), "$ ") {
				j++
				c.want = append(c.want, strings.TrimRight(body[j], " \t"))
			}
			for len(c.want) > 0 && c.want[len(c.want)-1] == "" {
				c.want = c.want[:len(c.want)-1]
			}
		}
		cmds = append(cmds, c)
	}
	return cmds
}

var goRunFloodgate = regexp.MustCompile(`\bgo run \./cmd/floodgate\b`)

// normalize runs the floodgate binary the tests built for "go run
// ./cmd/floodgate", and drops a trailing comment.
func normalize(line string) string {
	return goRunFloodgate.ReplaceAllString(stripComment(line), "floodgate")
}

// stripComment drops a " # comment" outside quotes.
func stripComment(line string) string {
	var quote rune
	for i, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && i > 0 && (line[i-1] == ' ' || line[i-1] == '\t'):
			return strings.TrimSpace(line[:i])
		}
	}
	return strings.TrimSpace(line)
}

func isServe(line string) bool { return strings.HasPrefix(normalize(line), "floodgate serve") }

func hasServe(cmds []docCommand) bool {
	for _, c := range cmds {
		if isServe(c.line) {
			return true
		}
	}
	return false
}

// docServer is the floodgate serve a file's commands talk to: the one its
// latest serve command started.
type docServer struct {
	cmd    *exec.Cmd
	banner []string          // what it printed until it listened
	ports  map[string]string // the docs' port: the test's
	stderr *syncbuf.Buffer
	done   chan struct{}
}

// exited returns what the server printed on stderr if it has exited.
func (s *docServer) exited() (string, bool) {
	if s == nil {
		return "", false
	}
	select {
	case <-s.done:
		return s.stderr.String(), true
	default:
		return "", false
	}
}

func (s *docServer) stop() {
	if s == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
}

// runDocBlocks runs a file's commands in order. With redisAddr, serve
// commands get --redis on it unless they name a store, and commands
// before the first serve command are left to the memory run.
func runDocBlocks(t *testing.T, root string, cmds []docCommand, redisAddr string) {
	var srv *docServer
	t.Cleanup(func() { srv.stop() })
	for _, c := range cmds {
		if recursive.MatchString(c.line) {
			t.Errorf("%s: %s runs the tests, this one included: mark its block <!-- norun: why -->", c.where, c.line)
			continue
		}
		if isServe(c.line) {
			srv.stop()
			srv = startDocServer(t, root, c, redisAddr)
			continue
		}
		if redisAddr != "" && srv == nil {
			continue
		}
		runDocCommand(t, root, c, srv, redisAddr)
	}
}

// recursive matches the commands that run the test suite, or tests: they
// would run TestDocs again, or take minutes.
var recursive = regexp.MustCompile(`(^|[;&|(]\s*)(\./)?scripts/test\b|\bgo test\b`)

var (
	bannerHTTP = regexp.MustCompile(`^HTTP API on https?://(127\.0\.0\.1:\d+)`)
	bannerRESP = regexp.MustCompile(`^Redis protocol on (127\.0\.0\.1:\d+)`)
	bannerGRPC = regexp.MustCompile(`^Envoy rate limit service \(gRPC\) on (127\.0\.0\.1:\d+)`)
	flagGRPC   = regexp.MustCompile(`--grpc[ =]\S+`)
	flagStore  = regexp.MustCompile(`--redis(-cluster)?[ =]`)
)

func startDocServer(t *testing.T, root string, c docCommand, redisAddr string) *docServer {
	t.Helper()
	line := normalize(c.line) + " --http 127.0.0.1:0 --resp 127.0.0.1:0"
	if flagGRPC.MatchString(line) {
		line += " --grpc 127.0.0.1:0"
	}
	if redisAddr != "" {
		line = rewriteRedis(line, redisAddr)
		if !flagStore.MatchString(line) {
			line += " --redis redis://" + redisAddr + "/0"
		}
	}
	cmd := exec.Command("sh", "-c", "exec "+line)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(binary)+":"+os.Getenv("PATH"), "GORACE=atexit_sleep_ms=0")
	if redisAddr != "" {
		// The docs show Redis's answers ("source":"store"): a budget that
		// a loaded machine keeps, so that the fallback does not answer
		// for a slow Redis. A --budget in the docs' command still wins.
		cmd.Env = append(cmd.Env, "FLOODGATE_BUDGET=5s")
	}
	stderr := &syncbuf.Buffer{}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &docServer{cmd: cmd, ports: map[string]string{}, stderr: stderr, done: make(chan struct{})}
	lines := make(chan string, 64) // more than a banner's lines
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default: // nobody reads once the server is up
			}
		}
		cmd.Wait()
	}()
	deadline := time.After(30 * time.Second)
	for s.ports["6380"] == "" {
		select {
		case l := <-lines:
			s.banner = append(s.banner, l)
			if m := bannerHTTP.FindStringSubmatch(l); m != nil {
				s.ports["8080"] = m[1]
			}
			if m := bannerGRPC.FindStringSubmatch(l); m != nil {
				s.ports["8081"] = m[1]
			}
			if m := bannerRESP.FindStringSubmatch(l); m != nil {
				s.ports["6380"] = m[1]
			}
		case <-s.done:
			t.Fatalf("%s: %s exited before listening:\n%s", c.where, line, stderr)
		case <-deadline:
			s.stop()
			t.Fatalf("%s: %s did not listen within 30s:\n%s", c.where, line, stderr)
		}
	}
	if c.want != nil && redisAddr == "" {
		if got := unmapPorts(strings.Join(s.banner, "\n"), s); !outputMatches(c.want, got) {
			t.Errorf("%s: %s printed\n%s\nthe docs show\n%s", c.where, c.line, got, strings.Join(c.want, "\n"))
		}
	}
	return s
}

var redisURLAddr = regexp.MustCompile(`[A-Za-z0-9.-]+:6379\b`)

func rewriteRedis(line, addr string) string { return redisURLAddr.ReplaceAllString(line, addr) }

// mapPorts rewrites the docs' addresses of serve's listeners to the
// test's: 8080 HTTP, 6380 the Redis protocol, 8081 gRPC.
func mapPorts(line string, s *docServer) string {
	if s == nil {
		return line
	}
	for doc, real := range s.ports {
		line = regexp.MustCompile(`(localhost|127\.0\.0\.1)?:`+doc+`\b`).ReplaceAllString(line, real)
		_, port, _ := strings.Cut(real, ":")
		line = regexp.MustCompile(`-p `+doc+`\b`).ReplaceAllString(line, "-p "+port)
	}
	return line
}

// unmapPorts writes the test's ports back as the docs' in an output.
func unmapPorts(out string, s *docServer) string {
	if s == nil {
		return out
	}
	for doc, real := range s.ports {
		out = strings.ReplaceAll(out, real, "127.0.0.1:"+doc)
	}
	return out
}

var redisCLI = regexp.MustCompile(`\bredis-cli\b`)

func runDocCommand(t *testing.T, root string, c docCommand, srv *docServer, redisAddr string) {
	t.Helper()
	line := mapPorts(normalize(c.line), srv)
	if redisAddr != "" {
		line = rewriteRedis(line, redisAddr)
	}
	// redis-cli prints raw replies when its output is not a terminal;
	// the docs show what it prints on one.
	line = redisCLI.ReplaceAllString(line, "redis-cli --no-raw")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", line)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(binary)+":"+os.Getenv("PATH"), "GORACE=atexit_sleep_ms=0")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Errorf("%s: %s: %v\n%s%s", c.where, line, err, stdout.String(), stderr.String())
		if log, ok := srv.exited(); ok {
			t.Fatalf("floodgate serve has exited:\n%s", log)
		}
		return
	}
	got := strings.TrimRight(unmapPorts(stdout.String(), srv), "\n")
	if c.want != nil && !outputMatches(c.want, got) {
		t.Errorf("%s: %s printed\n%s\nthe docs show\n%s", c.where, c.line, got, strings.Join(c.want, "\n"))
	}
}

// outputMatches says whether got's lines are want's, where "..." in a
// line of want stands for any text, and a line of want that is only
// "..." for any number of lines.
func outputMatches(want []string, got string) bool {
	var lines []string
	if got != "" {
		lines = strings.Split(got, "\n")
	}
	return linesMatch(want, lines)
}

func linesMatch(want, got []string) bool {
	for i, w := range want {
		if strings.TrimSpace(w) == "..." {
			for j := i; j <= len(got); j++ {
				if linesMatch(want[i+1:], got[j:]) {
					return true
				}
			}
			return false
		}
		if i >= len(got) || !lineMatches(w, got[i]) {
			return false
		}
	}
	return len(got) == len(want)
}

func lineMatches(want, got string) bool {
	if strings.HasPrefix(want, "{") || strings.HasPrefix(want, "[") {
		want, got = compactJSON(want), compactJSON(got)
	}
	parts := strings.Split(want, "...")
	for j, p := range parts {
		parts[j] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile(`^` + strings.Join(parts, `.*`) + `$`).MatchString(strings.TrimRight(got, " \t"))
}

// compactJSON drops the whitespace between a JSON line's tokens, which
// protojson (Envoy's /json) varies from one build to the next.
func compactJSON(s string) string {
	var b strings.Builder
	inString, escaped := false, false
	for _, r := range s {
		switch {
		case escaped:
			escaped = false
		case inString && r == '\\':
			escaped = true
		case inString:
			inString = r != '"'
		case r == '"':
			inString = true
		case r == ' ' || r == '\t':
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func TestOutputMatches(t *testing.T) {
	for _, c := range []struct {
		want []string
		got  string
		ok   bool
	}{
		{nil, "", true},
		{nil, "x", false},
		{[]string{"a"}, "a", true},
		{[]string{"a"}, "a\nb", false},
		{[]string{"5) (integer) ..."}, "5) (integer) 584", true},
		{[]string{"5) (integer) ..."}, "4) (integer) 584", false},
		{[]string{"a", "...", "d"}, "a\nb\nc\nd", true},
		{[]string{"a", "...", "d"}, "a\nd", true},
		{[]string{"a", "...", "d"}, "a\nb", false},
		{[]string{"..."}, "", true},
		{[]string{`{"a":1,"b":"x y"}`}, `{"a":1, "b":"x y"}`, true},
		{[]string{`{"a":1,"b":"x y"}`}, `{"a":1,"b":"xy"}`, false},
		{[]string{`{"a":"\"",...}`}, `{"a":"\"", "b":2}`, true},
	} {
		if got := outputMatches(c.want, c.got); got != c.ok {
			t.Errorf("outputMatches(%q, %q) = %v, want %v", c.want, c.got, got, c.ok)
		}
	}
}

func TestParseDocBlocks(t *testing.T) {
	src := "text\n```sh\ngo run ./x   # note\nfloodgate check --config a.yaml \\\n  --x\n```\n" +
		"<!-- norun: slow -->\n\n```sh\nsleep 100\n```\n" +
		"```go\nx := 1\n```\n" +
		"```sh\n$ curl a\n{}\n$ curl b\n```\n"
	got, err := parseDocBlocks("f.md", src)
	if err != nil {
		t.Fatal(err)
	}
	want := []docCommand{
		{where: "f.md:3", line: "go run ./x   # note"},
		{where: "f.md:4", line: "floodgate check --config a.yaml  --x"},
		{where: "f.md:16", line: "curl a", want: []string{"{}"}},
		{where: "f.md:18", line: "curl b", want: []string{}},
	}
	if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", want) {
		t.Errorf("parseDocBlocks:\n got %q\nwant %q", got, want)
	}
	if _, err := parseDocBlocks("f.md", "```sh\nx\n"); err == nil {
		t.Error("an unterminated block parsed")
	}
}

func TestRecursive(t *testing.T) {
	for line, want := range map[string]bool{
		"./scripts/test":                     true,
		"scripts/test   # all":               true,
		"cd x && ./scripts/test":             true,
		"go test -run Chaos ./cmd/floodgate": true,
		"go run ./examples/quickstart":       false,
		"curl -s localhost:8080/v1/test":     false,
	} {
		if got := recursive.MatchString(line); got != want {
			t.Errorf("recursive(%q) = %v, want %v", line, got, want)
		}
	}
}

// TestLayout holds docs/design.md's layout to the tree: every package of
// the module (commands, examples and the doc-only groups of internal/
// aside) is named in the first column of a row of its table.
func TestLayout(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	design, err := os.ReadFile(filepath.Join(root, "docs", "design.md"))
	if err != nil {
		t.Fatal(err)
	}
	named := map[string]bool{}
	for _, line := range strings.Split(string(design), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || cells[0] != "" {
			continue
		}
		for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(cells[1], -1) {
			named[strings.TrimSuffix(m[1], "/")] = true
		}
	}
	var dirs []string
	for _, top := range []string{"core", "internal", "redisstore", "fallback", "storetest", "httplimit", "grpclimit"} {
		filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() || d.Name() == "testdata" {
				return err
			}
			gos, _ := filepath.Glob(filepath.Join(path, "*.go"))
			if len(gos) > 0 && !(len(gos) == 1 && filepath.Base(gos[0]) == "doc.go") {
				rel, _ := filepath.Rel(root, path)
				dirs = append(dirs, filepath.ToSlash(rel))
			}
			return nil
		})
	}
	if len(dirs) < 20 {
		t.Fatalf("found only %d packages: %v", len(dirs), dirs)
	}
	for _, d := range dirs {
		if !named[d] {
			t.Errorf("docs/design.md's layout has no row for %s", d)
		}
	}
}
