package main

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestGRPCFlags: the --grpc-* flags and their variables reach the
// limits, and a value that would disable or break one is refused with
// the flag's name.
func TestGRPCFlags(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		env     map[string]string
		wantErr string // "" for valid flags
	}{
		{args: nil},
		{args: []string{"--grpc-max-streams", "7", "--grpc-max-msg-size", "1MiB", "--grpc-handshake-timeout", "2s"}},
		{env: map[string]string{"FLOODGATE_GRPC_MAX_STREAMS": "7", "FLOODGATE_GRPC_MAX_MSG_SIZE": "1MiB", "FLOODGATE_GRPC_HANDSHAKE_TIMEOUT": "2s"}},
		{args: []string{"--grpc-max-conns", "0"}, wantErr: "--grpc-max-conns ($FLOODGATE_GRPC_MAX_CONNS) must be at least 1, got 0"},
		{args: []string{"--grpc-max-streams", "0"}, wantErr: "--grpc-max-streams ($FLOODGATE_GRPC_MAX_STREAMS) must be 1 to 2147483647, got 0"},
		{args: []string{"--grpc-max-streams", "2147483648"}, wantErr: "must be 1 to 2147483647, got 2147483648"},
		{args: []string{"--grpc-max-msg-size", "0"}, wantErr: `--grpc-max-msg-size ($FLOODGATE_GRPC_MAX_MSG_SIZE): "0" is not a size in bytes`},
		{args: []string{"--grpc-max-msg-size", "2GiB"}, wantErr: "2GiB is more than the maximum 1GiB"},
		{env: map[string]string{"FLOODGATE_GRPC_MAX_MSG_SIZE": "lots"}, wantErr: `"lots" is not a size in bytes`},
		{args: []string{"--grpc-handshake-timeout", "0s"}, wantErr: "--grpc-handshake-timeout ($FLOODGATE_GRPC_HANDSHAKE_TIMEOUT) must be positive, got 0s"},
		{args: []string{"--grpc-idle-timeout", "-1s"}, wantErr: "--grpc-idle-timeout ($FLOODGATE_GRPC_IDLE_TIMEOUT) must be positive, got -1s"},
	} {
		t.Run(strings.Join(append(tc.args, envPairs(tc.env)...), " "), func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			f, code, ok := parseServeFlags(append([]string{"--grpc", "127.0.0.1:0"}, tc.args...), io.Discard)
			if !ok {
				t.Fatalf("flags refused, exit status %d", code)
			}
			_, err := grpcOptions(f)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatal(err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
			}
			if tc.wantErr == "" && (len(tc.args) > 0 || len(tc.env) > 0) {
				if f.grpcStreams != 7 || f.grpcMsgSize != "1MiB" || f.grpcLimits.HandshakeTimeout != 2*time.Second {
					t.Errorf("limits %d, %q, %s; want 7, 1MiB, 2s", f.grpcStreams, f.grpcMsgSize, f.grpcLimits.HandshakeTimeout)
				}
			}
		})
	}
}

// envPairs returns m's variables as NAME=value, sorted.
func envPairs(m map[string]string) []string {
	var s []string
	for k, v := range m {
		s = append(s, k+"="+v)
	}
	slices.Sort(s)
	return s
}
