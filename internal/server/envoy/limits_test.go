package envoy_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/envoy"
	"github.com/floodgate/floodgate/internal/testkit/envoytest"
)

const shouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// serveLimited serves the rate limit service of a "web" domain on a
// loopback port with envoy.ServerOptions(l) until t ends, and returns its
// address.
func serveLimited(t *testing.T, l envoy.Limits) string {
	t.Helper()
	st := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1})
	t.Cleanup(func() { st.Close() })
	svc := newEnvoyOn(t, st, "web.yaml", webDomain, nil)
	opts, err := envoy.ServerOptions(l)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := startGRPC(t, svc, opts...)
	return addr
}

// h2conn is a raw HTTP/2 client: it sends what a gRPC client would not
// (headers without a body, a message's length without the message) and
// sees the server's frames.
type h2conn struct {
	t        *testing.T
	c        net.Conn
	fr       *http2.Framer
	hbuf     bytes.Buffer
	enc      *hpack.Encoder
	settings map[http2.SettingID]uint32
}

// dialH2 connects to addr, sends the preface and empty settings, and
// reads the server's settings. Every read and write is bounded by a 10s
// deadline on the connection.
func dialH2(t *testing.T, addr string) *h2conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	h := &h2conn{t: t, c: c, fr: http2.NewFramer(c, c), settings: map[http2.SettingID]uint32{}}
	h.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	h.enc = hpack.NewEncoder(&h.hbuf)
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := h.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the server's settings: %v", err)
		}
		if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
			s.ForeachSetting(func(s http2.Setting) error { h.settings[s.ID] = s.Val; return nil })
			if err := h.fr.WriteSettingsAck(); err != nil {
				t.Fatal(err)
			}
			return h
		}
	}
}

// open starts a call of method on stream id with metadata md (name,
// value, ...), and sends no message.
func (h *h2conn) open(id uint32, method string, md ...string) {
	h.t.Helper()
	h.hbuf.Reset()
	fields := []string{":method", "POST", ":scheme", "http", ":path", method, ":authority", "floodgate", "content-type", "application/grpc", "te", "trailers"}
	fields = append(fields, md...)
	for i := 0; i+1 < len(fields); i += 2 {
		h.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.hbuf.Bytes(), EndHeaders: true}); err != nil {
		h.t.Fatal(err)
	}
}

// end reads frames until stream id ends, and returns its grpc-status
// ("" if none) or the code of the RST_STREAM that ended it.
func (h *h2conn) end(id uint32) (grpcStatus string, rst http2.ErrCode) {
	h.t.Helper()
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			h.t.Fatalf("waiting for stream %d to end: %v", id, err)
		}
		if f.Header().StreamID != id {
			continue
		}
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			return grpcStatus, f.ErrCode
		case *http2.MetaHeadersFrame:
			if v := f.PseudoValue("status"); v != "" && v != "200" {
				h.t.Fatalf("stream %d: HTTP status %s", id, v)
			}
			for _, hf := range f.RegularFields() {
				if hf.Name == "grpc-status" {
					grpcStatus = hf.Value
				}
			}
			if f.StreamEnded() {
				return grpcStatus, http2.ErrCodeNo
			}
		}
	}
}

// TestRequireTokenBeforeBody: a call without the token is refused on its
// headers, before any of its message is sent; health checks need none.
func TestRequireTokenBeforeBody(t *testing.T) {
	addr := serveLimited(t, envoy.Limits{Token: "s3cret"})
	h := dialH2(t, addr)
	id := uint32(1)
	for _, tc := range []struct {
		name, method string
		md           []string
	}{
		{"no token", shouldRateLimit, nil},
		{"wrong token", shouldRateLimit, []string{"authorization", "Bearer s3crex"}},
		{"not bearer", shouldRateLimit, []string{"authorization", "Basic s3cret"}},
		{"unknown method", "/x.Y/Z", nil},
	} {
		h.open(id, tc.method, tc.md...)
		if got, rst := h.end(id); got != "16" || rst != http2.ErrCodeNo && rst != http2.ErrCodeCancel {
			t.Errorf("%s: grpc-status %q, RST_STREAM %v; want 16 (Unauthenticated) before the body", tc.name, got, rst)
		}
		id += 2
	}

	conn := envoytest.Dial(t, addr)
	req := envoytest.Request("web", envoytest.Descriptor("ip", "a"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, auth := range []string{"Bearer s3cret", "bEaReR s3cret"} {
		_, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(metadata.AppendToOutgoingContext(ctx, "authorization", auth), req)
		if err != nil {
			t.Errorf("with %q: %v", auth, err)
		}
	}
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req); status.Code(err) != codes.Unauthenticated {
		t.Errorf("without the token: %v, want Unauthenticated", err)
	}
	if r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health without the token: %v, %v", r, err)
	}
}

// call sends a whole call of method with an empty message on stream id,
// and returns its grpc-status.
func (h *h2conn) call(id uint32, method string, md ...string) string {
	h.t.Helper()
	h.open(id, method, md...)
	if err := h.fr.WriteData(id, true, make([]byte, 5)); err != nil {
		h.t.Fatal(err)
	}
	got, _ := h.end(id)
	return got
}

// TestHealthWithoutToken: with a token required, health checks without
// it are served, but no more than 8 at a time on one connection, since
// each may have its message buffered.
func TestHealthWithoutToken(t *testing.T) {
	const check = "/grpc.health.v1.Health/Check"
	addr := serveLimited(t, envoy.Limits{Token: "s3cret"})
	h := dialH2(t, addr)
	for id := uint32(1); id <= 15; id += 2 {
		h.open(id, check) // waiting for their messages
	}
	h.open(17, check)
	if got, _ := h.end(17); got != "8" {
		t.Errorf("a ninth health check in flight: grpc-status %q, want 8 (ResourceExhausted)", got)
	}
	if got := h.call(19, check, "authorization", "Bearer s3cret"); got != "0" {
		t.Errorf("a health check with the token: grpc-status %q, want 0", got)
	}
	if got := dialH2(t, addr).call(1, check); got != "0" {
		t.Errorf("a health check on another connection: grpc-status %q, want 0", got)
	}
	// Their streams ended, the eight make room, once the server has
	// counted them out.
	for id := uint32(1); id <= 15; id += 2 {
		if err := h.fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
			t.Fatal(err)
		}
	}
	id := uint32(21)
	for range 1000 {
		if got := h.call(id, check); got == "0" {
			return
		} else if got != "8" {
			t.Fatalf("a health check: grpc-status %q", got)
		}
		id += 2
	}
	t.Error("health checks cancelled were still counted after 1000 calls")
}

// TestLimits: the server announces its limits, refuses streams past
// MaxStreams unread, and refuses a message longer than MaxMsgSize on its
// length alone.
func TestLimits(t *testing.T) {
	l := envoy.Limits{MaxStreams: 2, MaxMsgSize: 1000}
	h := dialH2(t, serveLimited(t, l))
	for id, want := range map[http2.SettingID]uint32{http2.SettingMaxConcurrentStreams: 2, http2.SettingInitialWindowSize: 64 << 10, http2.SettingMaxHeaderListSize: 64 << 10} {
		if h.settings[id] != want {
			t.Errorf("setting %v = %d, want %d", id, h.settings[id], want)
		}
	}
	// Two calls wait for their messages; a third is refused.
	h.open(1, shouldRateLimit)
	h.open(3, shouldRateLimit)
	h.open(5, shouldRateLimit)
	if got, rst := h.end(5); rst != http2.ErrCodeRefusedStream {
		t.Errorf("a stream past MaxStreams: grpc-status %q, RST_STREAM %v; want REFUSED_STREAM", got, rst)
	}
	for id, length := range map[uint32]uint32{1: 1001, 3: 1 << 31} {
		var prefix [5]byte
		binary.BigEndian.PutUint32(prefix[1:], length)
		if err := h.fr.WriteData(id, false, prefix[:]); err != nil {
			t.Fatal(err)
		}
		if got, _ := h.end(id); got != "8" {
			t.Errorf("a message of %d bytes, more than MaxMsgSize: grpc-status %q, want 8 (ResourceExhausted)", length, got)
		}
	}
}

// TestConnectionTimeouts: a connection that never sends the preface is
// closed after HandshakeTimeout, one without calls gets GOAWAY after
// IdleTimeout.
func TestConnectionTimeouts(t *testing.T) {
	addr := serveLimited(t, envoy.Limits{HandshakeTimeout: 50 * time.Millisecond, IdleTimeout: 50 * time.Millisecond})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	// The server sends its settings first, then closes: io.Copy's nil is
	// the end of the stream.
	if n, err := io.Copy(io.Discard, c); err != nil && !isReset(err) {
		t.Errorf("a connection without the preface: read %d bytes, then %v; want it closed", n, err)
	}
	h := dialH2(t, addr)
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			t.Fatalf("an idle connection: %v before GOAWAY", err)
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			if string(g.DebugData()) != "max_idle" {
				t.Errorf("GOAWAY %q, want max_idle", g.DebugData())
			}
			break
		}
	}
}

// isReset reports whether err is the peer's reset of the connection.
func isReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }
