package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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

// TestUnsent: a failure to reach Redis goes again; a failure after the
// send, whose call may have run, does not.
func TestUnsent(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	read := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	tests := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{dial, true},
		{fmt.Errorf("redis: %w", dial), true},
		{redis.ErrPoolTimeout, true},
		{read, false},
		{&net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}, true},
		{io.EOF, false},
		{io.ErrUnexpectedEOF, false},
		{context.DeadlineExceeded, false},
		{replyErr("TRYAGAIN Multiple keys request during rehashing of slot"), false},
		{redis.ErrClosed, false},
	}
	for _, tt := range tests {
		if got := unsent(tt.err); got != tt.want {
			t.Errorf("unsent(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// TestResends: the store sends a call that did not run again as the
// client's retry options say.
func TestResends(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		client redis.UniversalClient
		want   resends
	}{
		{redis.NewClient(&redis.Options{}), resends{3, 10 * ms, time.Second}},
		{redis.NewClient(&redis.Options{MaxRetries: -1}), resends{0, 10 * ms, time.Second}},
		{redis.NewClient(&redis.Options{MaxRetries: 5, MinRetryBackoff: ms, MaxRetryBackoff: 4 * ms}), resends{5, ms, 4 * ms}},
		{redis.NewClusterClient(&redis.ClusterOptions{}), resends{3, 10 * ms, time.Second}},
		{redis.NewClusterClient(&redis.ClusterOptions{MaxRedirects: -1}), resends{0, 10 * ms, time.Second}},
		{redis.NewRing(&redis.RingOptions{MaxRetries: 2}), resends{2, 10 * ms, time.Second}},
	}
	for i, tt := range tests {
		got := resendsOf(tt.client)
		tt.client.Close()
		if got != tt.want {
			t.Errorf("client %d: %+v, want %+v", i, got, tt.want)
		}
	}
	r := resends{tries: 5, minWait: 2 * ms, maxWait: 10 * ms}
	for try, most := range []time.Duration{1: 6 * ms, 2: 10 * ms, 3: 10 * ms, 4: 10 * ms, 5: 10 * ms} {
		for range 20 {
			if w := r.wait(try); try > 0 && (w < 2*ms || w > most) {
				t.Errorf("wait(%d) = %v, want %v to %v", try, w, 2*ms, most)
			}
		}
	}
	// No panic, nor a wait beyond the bound, for options go-redis takes.
	for _, r := range []resends{{1, 0, 0}, {1, -1, -1}, {1, -5 * ms, ms}, {1, ms, -5 * ms}, {64, ms, math.MaxInt64}, {64, math.MaxInt64, math.MaxInt64}} {
		for try := 1; try <= r.tries; try++ {
			if w := r.wait(try); w < 0 || r.minWait <= 0 && w != 0 || r.minWait > 0 && w > max(r.maxWait, r.minWait) {
				t.Errorf("%+v: wait(%d) = %v", r, try, w)
			}
		}
	}
}

// TestNewClientIdle: NewClient's clients drop a connection idle for
// idleConnTimeout, or as long as the URL says.
func TestNewClientIdle(t *testing.T) {
	tests := []struct {
		url  string
		want time.Duration
	}{
		{"redis://127.0.0.1:1", idleConnTimeout},
		{"rediss://127.0.0.1:1?conn_max_idle_time=30m", 30 * time.Minute},
		{"redis+sentinel://127.0.0.1:1?master_name=m", idleConnTimeout},
		{"redis+sentinel://127.0.0.1:1?master_name=m&conn_max_idle_time=1m", time.Minute},
		{"redis+cluster://127.0.0.1:1", idleConnTimeout},
		{"redis+cluster://127.0.0.1:1?conn_max_idle_time=-1", -1},
	}
	for _, tt := range tests {
		c, err := NewClient(tt.url)
		if err != nil {
			t.Fatalf("%s: %v", tt.url, err)
		}
		var got time.Duration
		switch c := c.(type) {
		case *redis.Client:
			got = c.Options().ConnMaxIdleTime
		case *redis.ClusterClient:
			got = c.Options().ConnMaxIdleTime
		}
		c.Close()
		if got != tt.want {
			t.Errorf("%s: ConnMaxIdleTime %v, want %v", tt.url, got, tt.want)
		}
	}
}
