package redisstore

import (
	"context"
	"errors"
	"testing"
)

// replyErr is an error reply from Redis, as go-redis gives it.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// TestSendAgain: a pipelined call goes again only when Redis refused it
// before it ran, and never on MOVED or ASK, which a call keeps when its
// send after one fails on the connection.
func TestSendAgain(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{replyErr("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{replyErr("CLUSTERDOWN The cluster is down"), true},
		{replyErr("READONLY You can't write against a read only replica."), true},
		{replyErr("LOADING Redis is loading the dataset in memory"), true},
		{replyErr("MOVED 3999 127.0.0.1:6381"), false},
		{replyErr("ASK 3999 127.0.0.1:6381"), false},
		{replyErr("FLOODGATE wrong type: k is not a set of permits"), false},
		{replyErr("ERR Error running script"), false},
		{errors.New("read tcp 127.0.0.1:1->127.0.0.1:2: i/o timeout"), false},
		{context.DeadlineExceeded, false},
	}
	for _, tt := range tests {
		if got := sendAgain(tt.err); got != tt.want {
			t.Errorf("sendAgain(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
