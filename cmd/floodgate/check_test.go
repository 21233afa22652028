package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestServerURL: what --server accepts, and the error for what it does
// not, instead of Go's URL parser's.
func TestServerURL(t *testing.T) {
	tests := []struct {
		in, want string // want "" for an error
	}{
		{"http://127.0.0.1:8080", "http://127.0.0.1:8080"},
		{"http://127.0.0.1:8080/", "http://127.0.0.1:8080"},
		{"127.0.0.1:8080", "http://127.0.0.1:8080"},
		{" localhost:8080 ", "http://localhost:8080"},
		{"[::1]:8080", "http://[::1]:8080"},
		{"https://limits.example.com", "https://limits.example.com"},
		{"https://edge.example.com/floodgate/", "https://edge.example.com/floodgate"},
		{"limits.example.com", "http://limits.example.com"},
		{"ftp://127.0.0.1:8080", ""},
		{"redis://127.0.0.1:6379", ""},
		{"http://", ""},
		{"", ""},
		{"127.0.0.1:8080?x=1", ""},
		{"http://127.0.0.1:8080#top", ""},
		{"http://127.0.0.1:80 80", ""},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := serverURL(tt.in)
			if tt.want == "" {
				if err == nil {
					t.Fatalf("serverURL(%q) = %q, want an error", tt.in, got)
				}
				if !strings.Contains(err.Error(), "write http://host:port") || strings.Contains(err.Error(), "parse") {
					t.Errorf("serverURL(%q): error %q does not say what to write", tt.in, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("serverURL(%q) = %q, %v, want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

// TestCheckServer: floodgate check --server host:port asks the server at
// http://host:port; an unusable --server or a server that does not answer
// is a clear error and exit status 2.
func TestCheckServer(t *testing.T) {
	var asked []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		asked = append(asked, r.Method+" "+r.URL.Path+" "+string(b))
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"rule":"api","allowed":true,"limit":2,"remaining":1,"source":"store"}`)
	}))
	defer srv.Close()
	hostPort := strings.TrimPrefix(srv.URL, "http://")
	tests := []struct {
		name   string
		server string
		code   int
		stderr string // a part of it
	}{
		{"host:port", hostPort, 0, ""},
		{"http URL", srv.URL + "/", 0, ""},
		{"another scheme", "ftp://" + hostPort, 2, `--server "ftp://` + hostPort + `" is not the address of a floodgate serve`},
		{"nobody there", "127.0.0.1:1", 2, "no answer from http://127.0.0.1:1: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			asked = nil
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), []string{"check", "--server", tt.server, "api", "k"}, &stdout, &stderr)
			if code != tt.code || !strings.Contains(stderr.String(), tt.stderr) {
				t.Fatalf("exit %d, want %d; stderr %q, want it to say %q", code, tt.code, stderr.String(), tt.stderr)
			}
			if tt.code != 0 {
				return
			}
			if want := `POST /v1/check {"rule":"api","key":"k"}`; len(asked) != 1 || asked[0] != want {
				t.Errorf("the server was asked %q, want [%s]", asked, want)
			}
			var r map[string]any
			if err := json.Unmarshal(stdout.Bytes(), &r); err != nil || r["allowed"] != true {
				t.Errorf("stdout %q: %v", stdout.String(), err)
			}
			if stderr.Len() != 0 {
				t.Errorf("stderr %q, want nothing: the server decided", stderr.String())
			}
		})
	}
}

// TestCheckThrowaway: without --server or --redis, check decides on an
// in-memory store of its own, and says so on stderr, so that a fresh
// limit's answer is not taken for the service's.
func TestCheckThrowaway(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"check", "example", "k"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), `"allowed":true`) {
		t.Errorf("stdout %q", stdout.String())
	}
	if want := "floodgate check: decided on a throwaway in-memory store"; !strings.HasPrefix(stderr.String(), want) {
		t.Errorf("stderr %q, want it to start with %q", stderr.String(), want)
	}
}

// floodgate check --server refuses a RULE or KEY that is not UTF-8, as the
// server does, before it sends anything: JSON would carry U+FFFD instead.
func TestCheckRemoteInvalidUTF8(t *testing.T) {
	tests := []struct {
		name      string
		rule, key string
		wantInErr string
	}{
		{"key 0xff", "api", "x\xffy", `KEY "x\xffy" is not valid UTF-8`},
		{"key 0xfe", "api", "x\xfey", `KEY "x\xfey" is not valid UTF-8`},
		{"rule", "a\xc3", "k", `RULE "a\xc3" is not valid UTF-8`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			// Port 1 of loopback: nothing is sent there.
			code := checkCmd(context.Background(), []string{"--server", "http://127.0.0.1:1", tt.rule, tt.key}, &stdout, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), tt.wantInErr) || stdout.Len() != 0 {
				t.Errorf("exit %d, stderr %q, stdout %q; want 2 and %q", code, stderr.String(), stdout.String(), tt.wantInErr)
			}
		})
	}
}
