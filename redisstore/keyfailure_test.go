package redisstore

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/floodgate/floodgate"
)

// TestWrapKeyFailure: wrap tells an error about one key (ErrKey, which is
// ErrStore too) from the server's failures (ErrStore alone), which a
// fallback's breaker must count.
func TestWrapKeyFailure(t *testing.T) {
	tests := []struct {
		reply string
		key   bool
		want  string
	}{
		{"FLOODGATE wrong type: key p:{k}:0b holds a value that is not floodgate state", true, "redis: wrong type: key p:{k}:0b"},
		{"FLOODGATE corrupt state: key p:{k}:0b does not hold floodgate data", true, "redis: corrupt state"},
		{"WRONGTYPE Operation against a key holding the wrong kind of value script: abc, on @user_script:1.", true, "redis: WRONGTYPE"},
		{"NOPERM this user has no permissions to access one of the keys used as arguments", true, "redis: NOPERM this user"},
		{"NOPERM this user has no permissions to run the 'evalsha' command", true, "redis: NOPERM"},
		{"ERR The user executing the script can't access at least one of the keys mentioned in the command arguments", true,
			"redis: NOPERM permission denied in the script: The user executing the script can't access"},
		// Redis 7.2's and Valkey 8's words for the same refusals.
		{"NOPERM No permissions to access a key", true, "redis: NOPERM No permissions"},
		{"NOPERM User floodgate has no permissions to run the 'evalsha' command", true, "redis: NOPERM User"},
		{"ERR ACL failure in script: No permissions to access a key script: abc, on @user_script:1.", true,
			"redis: NOPERM permission denied in the script: ACL failure in script: No permissions"},
		{"FLOODGATE unknown limit kind 9", false, "redis: unknown limit kind 9"},
		{"LOADING Redis is loading the dataset in memory", false, "redis: LOADING"},
		{"READONLY You can't write against a read only replica.", false, "redis: READONLY"},
		{"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", false, "redis: MASTERDOWN"},
		{"CLUSTERDOWN The cluster is down", false, "redis: CLUSTERDOWN"},
		{"OOM command not allowed when used memory > 'maxmemory'.", false, "redis: OOM"},
		{"BUSY Redis is busy running a script.", false, "redis: BUSY"},
		{"dial tcp 127.0.0.1:1: connect: connection refused", false, "redis: dial tcp"},
	}
	s := &Store{}
	for _, tt := range tests {
		err := s.wrap(context.Background(), errors.New(tt.reply))
		if errors.Is(err, floodgate.ErrKey) != tt.key || !errors.Is(err, floodgate.ErrStore) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("wrap(%q) = %v; want ErrKey %v, ErrStore, saying %q", tt.reply, err, tt.key, tt.want)
		}
	}
}

// TestCause: the Store keeps the last error of its client's calls that is
// the server's (not a key's, a script's answer or a context's) until a
// call succeeds.
func TestCause(t *testing.T) {
	s := &Store{}
	steps := []struct {
		err  error
		want string // "" for no cause
	}{
		{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), "connection refused"},
		{context.DeadlineExceeded, "connection refused"},
		{errors.New("NOPERM this user has no permissions to access one of the keys used as arguments"), "connection refused"},
		{errors.New("FLOODGATE overridden"), "connection refused"},
		{errors.New("WRONGPASS invalid username-password pair or user is disabled."), "WRONGPASS"},
		{nil, ""},
		{errors.New("LOADING Redis is loading the dataset in memory"), "LOADING"},
	}
	for i, st := range steps {
		s.note(st.err)
		got := s.Cause()
		if (got == nil) != (st.want == "") || (got != nil && !strings.Contains(got.Error(), st.want)) {
			t.Errorf("step %d: Cause() = %v, want %q", i, got, st.want)
		}
	}
}

// TestRefusedKey: an ACL's refusal of a key, in Redis 7.0's words and in
// Redis 7.2's and Valkey's, sends a batch again call by call; a refused
// command or another key error does not.
func TestRefusedKey(t *testing.T) {
	tests := []struct {
		reply string
		want  bool
	}{
		{"NOPERM this user has no permissions to access one of the keys used as arguments", true},
		{"NOPERM No permissions to access a key", true},
		{"NOPERM User u has no permissions to access the 'k' key", true},
		{"NOPERM User u has no permissions to run the 'evalsha' command", false},
		{"WRONGTYPE Operation against a key holding the wrong kind of value", false},
		{"ERR no permissions to access, said nobody", false},
	}
	s := &Store{}
	for _, tt := range tests {
		err := s.wrap(context.Background(), errors.New(tt.reply))
		if got := refusedKey(err); got != tt.want {
			t.Errorf("refusedKey(%v) = %v, want %v", err, got, tt.want)
		}
	}
}
