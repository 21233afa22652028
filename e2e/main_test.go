package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/testkit/syncbuf"
)

// binary is the floodgate command, built once by TestMain from the library
// module in the directory above, with the race detector.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "floodgate-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "floodgate")
	// Built in the library's module, with its go.mod: this module does not
	// require the command's own dependencies.
	build := exec.Command("go", "build", "-race", "-o", binary, "./cmd/floodgate")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building floodgate: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// instance is a running floodgate serve.
type instance struct {
	httpURL string
}

// serve starts floodgate serve with args on a free loopback port, waits
// until it prints where its HTTP API listens, and kills it when t ends.
func serve(t *testing.T, args ...string) *instance {
	t.Helper()
	args = append([]string{"serve", "--http", "127.0.0.1:0", "--resp", ""}, args...)
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0")
	stderr := &syncbuf.Buffer{}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		for range lines {
		}
	})
	in := &instance{}
	timeout := time.After(30 * time.Second)
	for in.httpURL == "" {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("floodgate serve exited before listening:\n%s", stderr)
			}
			if rest, ok := strings.CutPrefix(line, "HTTP API on "); ok {
				in.httpURL = strings.Fields(rest)[0]
			}
		case <-timeout:
			t.Fatalf("floodgate serve did not say where it listens:\n%s", stderr)
		}
	}
	go func() {
		for range lines {
		}
	}()
	return in
}
