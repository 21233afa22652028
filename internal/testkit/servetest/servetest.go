// Package servetest starts a floodgate serve process for a test and reads
// from its banner where it listens.
package servetest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/testkit/syncbuf"
)

// Process is a running floodgate serve, started by Start.
type Process struct {
	Cmd      *exec.Cmd
	HTTPURL  string          // the HTTP API's base URL
	RESPAddr string          // the Redis protocol's address: Start waits for it with resp
	GRPCAddr string          // the Envoy rate limit service's, with --grpc
	Stdout   *syncbuf.Buffer // every line it printed
	Stderr   *syncbuf.Buffer
	Done     <-chan error // Wait's result, once it has exited
}

// Start starts cmd, a floodgate serve whose output Start takes, waits up
// to 30 s until its banner says where its HTTP API listens and, with
// resp, its Redis protocol (a banner logged with --log-format json is
// read too), and kills it when t ends. It fails t if serve exits first.
func Start(t testing.TB, cmd *exec.Cmd, resp bool) *Process {
	t.Helper()
	done := make(chan error, 1)
	p := &Process{Cmd: cmd, Stdout: &syncbuf.Buffer{}, Stderr: &syncbuf.Buffer{}, Done: done}
	cmd.Stderr = p.Stderr
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
			fmt.Fprintln(p.Stdout, sc.Text())
			lines <- sc.Text()
		}
		close(lines)
		done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		for range lines {
		}
	})
	timeout := time.After(30 * time.Second)
	for p.HTTPURL == "" || resp && p.RESPAddr == "" {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("floodgate serve exited before listening:\n%s", p.Stderr)
			}
			var rec struct{ Msg string }
			if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &rec) == nil {
				line = rec.Msg // --log-format json: the banner's lines are records
			}
			if rest, ok := strings.CutPrefix(line, "HTTP API on "); ok {
				p.HTTPURL = strings.Fields(rest)[0]
			}
			if rest, ok := strings.CutPrefix(line, "Envoy rate limit service (gRPC) on "); ok {
				p.GRPCAddr = strings.Fields(rest)[0]
			}
			if rest, ok := strings.CutPrefix(line, "Redis protocol on "); ok {
				p.RESPAddr = strings.Fields(rest)[0]
			}
		case <-timeout:
			t.Fatalf("floodgate serve did not say where it listens:\n%s", p.Stderr)
		}
	}
	go func() {
		for range lines {
		}
	}()
	return p
}
