package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/floodgate/floodgate/internal/testkit/servetest"
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
	return &instance{httpURL: servetest.Start(t, cmd, false).HTTPURL}
}
