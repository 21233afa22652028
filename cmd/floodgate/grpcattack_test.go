package main

import (
	"bufio"
	"bytes"
	"context"
	be "encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/floodgate/floodgate/internal/testkit/envoytest"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// The gRPC listener under attack (issue 55): floodgate serve, built
// without the race detector (whose shadow memory would be most of what
// is measured), is attacked over loopback with raw HTTP/2 frames while a
// legitimate client calls it on a connection of its own. The process's
// peak RSS must stay under rssBound; the legitimate client's calls must
// all succeed, and their latency is logged (a figure, not an assertion).

// rssBound is the most memory floodgate serve may hold under each attack.
const rssBound = 256 << 20

var plain struct {
	once sync.Once
	path string
	err  error
}

// plainBinary returns floodgate built without -race, built once, or the
// binary named by $FLOODGATE_ATTACK_BINARY (to measure another build,
// such as one from before the limits).
func plainBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("FLOODGATE_ATTACK_BINARY"); p != "" {
		return p
	}
	plain.once.Do(func() {
		plain.path = filepath.Join(filepath.Dir(binary), "floodgate-plain")
		if out, err := exec.Command("go", "build", "-o", plain.path, ".").CombinedOutput(); err != nil {
			plain.err = fmt.Errorf("building floodgate without -race: %v\n%s", err, out)
		}
	})
	if plain.err != nil {
		t.Fatal(plain.err)
	}
	return plain.path
}

// attackDomain is the Envoy domain that the legitimate client's calls
// are decided against: a limit that it never reaches.
const attackDomain = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n"

// serveForAttack starts floodgate serve with --grpc and args, and the
// legitimate client connected to it before any attack.
func serveForAttack(t *testing.T, token string, args ...string) (*instance, *legitClient) {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "edge.yaml"), attackDomain)
	args = append([]string{"--config", dir, "--grpc", "127.0.0.1:0", "--ui=false", "--watch", "0"}, args...)
	if token != "" {
		args = append(args, "--token", token)
	}
	in := serveBinary(t, plainBinary(t), args...)
	if in.grpcAddr == "" {
		t.Fatal("floodgate serve did not say where it serves gRPC")
	}
	return in, startLegit(t, in.grpcAddr, token)
}

// peakRSS reads the peak and current resident memory of process pid, in
// bytes.
func peakRSS(t *testing.T, pid int) (hwm, rss int64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		name, v, ok := strings.Cut(line, ":")
		if !ok || (name != "VmHWM" && name != "VmRSS") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			t.Fatalf("%s: %q", name, v)
		}
		if name == "VmHWM" {
			hwm = kb << 10
		} else {
			rss = kb << 10
		}
	}
	return hwm, rss
}

// checkRSS fails t if floodgate serve's peak RSS passed rssBound.
func checkRSS(t *testing.T, in *instance) {
	t.Helper()
	hwm, rss := peakRSS(t, in.cmd.Process.Pid)
	t.Logf("floodgate serve: peak RSS %.1f MiB, now %.1f MiB", float64(hwm)/(1<<20), float64(rss)/(1<<20))
	if hwm > rssBound {
		t.Errorf("floodgate serve's peak RSS is %.1f MiB, more than %d MiB", float64(hwm)/(1<<20), rssBound>>20)
	}
}

// legitClient is a gRPC client, as Envoy is, calling ShouldRateLimit one
// call after another on its own connection until finish.
type legitClient struct {
	conn *grpc.ClientConn
	stop chan struct{}
	done chan struct{}
	lat  []time.Duration
	errs []error
}

func startLegit(t *testing.T, addr, token string) *legitClient {
	t.Helper()
	conn := envoytest.Dial(t, addr)
	l := &legitClient{conn: conn, stop: make(chan struct{}), done: make(chan struct{})}
	c := rlsv3.NewRateLimitServiceClient(conn)
	req := envoytest.Request("edge", envoytest.Descriptor("remote_address", "203.0.113.7"))
	call := func() error {
		// A deadline that a loaded machine keeps: a call starved of the
		// CPU for seconds is slow, which the latency figures show, not
		// refused; one that the attack blocks still fails.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if token != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		}
		resp, err := c.ShouldRateLimit(ctx, req)
		if err == nil && resp.OverallCode != rlsv3.RateLimitResponse_OK {
			err = fmt.Errorf("answer %v", resp)
		}
		return err
	}
	// Connected and warm before the attack starts, as Envoy's connection
	// would be.
	if err := call(); err != nil {
		t.Fatalf("the legitimate client's first call: %v", err)
	}
	go func() {
		defer close(l.done)
		for range 1_000_000 {
			select {
			case <-l.stop:
				return
			default:
			}
			start := time.Now()
			err := call()
			l.lat = append(l.lat, time.Since(start))
			if err != nil {
				l.errs = append(l.errs, err)
			}
		}
	}()
	return l
}

// finish stops the calls, logs their latency, and fails t if any failed.
func (l *legitClient) finish(t *testing.T) {
	t.Helper()
	close(l.stop)
	<-l.done
	if len(l.lat) == 0 {
		t.Error("the legitimate client made no call during the attack")
		return
	}
	slices.Sort(l.lat)
	q := func(p float64) time.Duration { return l.lat[int(p*float64(len(l.lat)-1))] }
	t.Logf("legitimate client: %d calls during the attack, p50 %s, p99 %s, max %s", len(l.lat), q(0.5), q(0.99), l.lat[len(l.lat)-1])
	if len(l.errs) > 0 {
		t.Errorf("%d of the legitimate client's %d calls failed, first: %v", len(l.errs), len(l.lat), l.errs[0])
	}
}

// h2Attacker is a raw HTTP/2 client that keeps to the server's flow
// control (as an attacker must, to be served) and sees how its streams
// end.
type h2Attacker struct {
	c    net.Conn
	wmu  sync.Mutex // the framer's writes
	fr   *http2.Framer
	hbuf bytes.Buffer
	enc  *hpack.Encoder

	mu       sync.Mutex
	cond     *sync.Cond
	connWin  int64
	initWin  int64
	win      map[uint32]int64
	closed   map[uint32]bool
	refused  int   // streams ended by REFUSED_STREAM
	answered int   // streams ended by the server's trailers
	err      error // the connection's end
	done     chan struct{}
}

// dialAttacker connects to addr, sends the preface and settings, and
// reads the server's frames until the connection ends; t's cleanup
// closes it.
func dialAttacker(t *testing.T, addr string) *h2Attacker {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	a := &h2Attacker{c: c, fr: http2.NewFramer(c, c), connWin: 65535, initWin: 65535,
		win: map[uint32]int64{}, closed: map[uint32]bool{}, done: make(chan struct{})}
	a.cond = sync.NewCond(&a.mu)
	a.enc = hpack.NewEncoder(&a.hbuf)
	a.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	t.Cleanup(func() {
		c.Close()
		<-a.done
	})
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := a.fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	go a.read()
	return a
}

func (a *h2Attacker) read() {
	defer close(a.done)
	for {
		f, err := a.fr.ReadFrame()
		a.mu.Lock()
		if err != nil {
			a.err = err
			a.cond.Broadcast()
			a.mu.Unlock()
			return
		}
		id := f.Header().StreamID
		// Acknowledgements are written after the lock is let go: a write
		// may wait for the server to read.
		var reply func() error
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				for s := range a.win {
					a.win[s] += int64(v) - a.initWin
				}
				a.initWin = int64(v)
			}
			if !f.IsAck() {
				reply = a.fr.WriteSettingsAck
			}
		case *http2.WindowUpdateFrame:
			if id == 0 {
				a.connWin += int64(f.Increment)
			} else {
				a.win[id] += int64(f.Increment)
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				reply = func() error { return a.fr.WritePing(true, f.Data) }
			}
		case *http2.RSTStreamFrame:
			if !a.closed[id] && f.ErrCode == http2.ErrCodeRefusedStream {
				a.refused++
			}
			a.closed[id] = true
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				if !a.closed[id] {
					a.answered++
				}
				a.closed[id] = true
			}
		}
		a.cond.Broadcast()
		a.mu.Unlock()
		if reply != nil {
			a.write(reply)
		}
	}
}

// write runs one framer write; the reader's acknowledgements and the
// attack's frames take turns.
func (a *h2Attacker) write(w func() error) error {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	return w()
}

// send opens a call of method on stream id with metadata md and sends a
// message that its
// length prefix says is declared bytes long: the prefix and the first n
// bytes of it, as fast as the windows let it, never the rest. It gives
// up on a stream that the server closes or does not let it write to for
// stall. It returns the bytes sent after the prefix.
func (a *h2Attacker) send(method string, id, declared uint32, n int, stall time.Duration, md ...string) (int, error) {
	a.hbuf.Reset()
	fields := append([]string{":method", "POST", ":scheme", "http", ":path", method,
		":authority", "floodgate", "content-type", "application/grpc", "te", "trailers"}, md...)
	for i := 0; i+1 < len(fields); i += 2 {
		a.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	a.mu.Lock()
	a.win[id] = a.initWin
	a.mu.Unlock()
	if err := a.write(func() error {
		return a.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: a.hbuf.Bytes(), EndHeaders: true})
	}); err != nil {
		return 0, err
	}
	payload := make([]byte, 5+n)
	be.BigEndian.PutUint32(payload[1:5], declared)
	sent := 0
	for sent < len(payload) {
		a.mu.Lock()
		timer := time.AfterFunc(stall, func() {
			a.mu.Lock()
			a.cond.Broadcast()
			a.mu.Unlock()
		})
		deadline := time.Now().Add(stall)
		for !a.closed[id] && a.err == nil && min(a.connWin, a.win[id]) <= 0 && time.Now().Before(deadline) {
			a.cond.Wait()
		}
		timer.Stop()
		room := min(a.connWin, a.win[id], 16<<10, int64(len(payload)-sent))
		if a.closed[id] || a.err != nil || room <= 0 {
			err := a.err
			a.mu.Unlock()
			return max(sent-5, 0), err
		}
		a.connWin -= room
		a.win[id] -= room
		a.mu.Unlock()
		chunk := payload[sent : sent+int(room)]
		if err := a.write(func() error { return a.fr.WriteData(id, false, chunk) }); err != nil {
			return max(sent-5, 0), err
		}
		sent += int(room)
	}
	return n, nil
}

// counts returns how many streams were refused and answered so far.
func (a *h2Attacker) counts() (refused, answered int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.refused, a.answered
}

// streamFlood opens streams on one connection, calls of method, and
// sends each a message of declared bytes, of which it sends up to
// perStream, never finishing one; md is each stream's metadata.
func streamFlood(t *testing.T, addr, method string, streams int, declared uint32, perStream int, md ...string) {
	t.Helper()
	a := dialAttacker(t, addr)
	start := time.Now()
	var total int64
	for i := range streams {
		n, err := a.send(method, uint32(2*i+1), declared, perStream, 2*time.Second, md...)
		total += int64(n)
		if err != nil {
			t.Logf("the connection ended after %d streams: %v", i, err)
			break
		}
	}
	refused, answered := a.counts()
	t.Logf("%s: %d streams declaring %d bytes each: %.1f MiB sent in %s; %d refused unread, %d answered (an error), the rest held",
		method, streams, declared, float64(total)/(1<<20), time.Since(start).Round(time.Millisecond), refused, answered)
}

// TestGRPCStreamFlood: one connection opens 1,500 streams and sends 1 MB
// on each, never finishing a message; without credentials when --token
// is set. Then, on a second connection, the same with messages just
// under the size limit, the most the server accepts; with --token, a
// third does that with health checks, which need no token.
func TestGRPCStreamFlood(t *testing.T) {
	const rlsMethod, healthCheck = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", "/grpc.health.v1.Health/Check"
	for _, token := range []string{"", "s3cret"} {
		t.Run(fmt.Sprintf("token=%t", token != ""), func(t *testing.T) {
			in, legit := serveForAttack(t, token)
			// The attack: a message of 4 MiB less a byte (gRPC's
			// default limit), of which 1 MB is sent.
			streamFlood(t, in.grpcAddr, rlsMethod, 1500, 4<<20-1, 1_000_000)
			// Fitted to the default limit: 256 KiB, all but the last byte.
			streamFlood(t, in.grpcAddr, rlsMethod, 1500, 256<<10, 256<<10-1)
			if token != "" {
				streamFlood(t, in.grpcAddr, healthCheck, 1500, 256<<10, 256<<10-1)
			}
			legit.finish(t)
			checkRSS(t, in)
		})
	}
}

// TestGRPCNeverReads: a client sends 200,000 calls on one connection and
// never reads a byte of the answers; it stops when the server stops
// reading too (a write blocked for 2s).
func TestGRPCNeverReads(t *testing.T) {
	in, legit := serveForAttack(t, "")
	c, err := net.Dial("tcp", in.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w := bufio.NewWriterSize(c, 64<<10)
	fr := http2.NewFramer(w, nil)
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	msg, err := proto.Marshal(envoytest.Request("edge", envoytest.Descriptor("remote_address", "198.51.100.1")))
	if err != nil {
		t.Fatal(err)
	}
	body := be.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	body = append(body, msg...)
	io.WriteString(w, http2.ClientPreface)
	fr.WriteSettings()
	start := time.Now()
	sent := 0
	for ; sent < 200_000; sent++ {
		hbuf.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
			{":authority", "floodgate"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		id := uint32(2*sent + 1)
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hbuf.Bytes(), EndHeaders: true})
		fr.WriteData(id, true, body)
		if sent%100 == 99 {
			c.SetWriteDeadline(time.Now().Add(2 * time.Second))
			if err := w.Flush(); err != nil {
				t.Logf("the server stopped reading: %v", err)
				break
			}
		}
	}
	t.Logf("%d calls sent in %s, no answer read", sent, time.Since(start).Round(time.Millisecond))
	legit.finish(t)
	checkRSS(t, in)
}

// TestGRPCIdleConnections: 2,000 connections that never send the HTTP/2
// preface, twice --grpc-max-conns: each is closed after the handshake
// deadline, and the ones past the cap are accepted as others close.
func TestGRPCIdleConnections(t *testing.T) {
	const conns = 2000
	in, legit := serveForAttack(t, "", "--grpc-handshake-timeout", "1s", "--grpc-max-conns", "1000")
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var closed, open int
	var last time.Duration
	for i := range conns {
		c, err := net.DialTimeout("tcp", in.grpcAddr, 10*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, err := io.Copy(io.Discard, c) // the server's settings, then its close
			mu.Lock()
			defer mu.Unlock()
			if err == nil || isConnReset(err) {
				closed++
				last = max(last, time.Since(start))
			} else {
				open++
			}
		}()
	}
	wg.Wait()
	t.Logf("%d connections without a preface: %d closed by the server, the last %s after the first was opened; %d still open after 30s",
		conns, closed, last.Round(time.Millisecond), open)
	if open > 0 {
		t.Errorf("%d of %d connections without a preface were still open after 30s", open, conns)
	}
	legit.finish(t)
	checkRSS(t, in)
}

// isConnReset reports whether err is the server's reset of a connection
// that it closed with data unread.
func isConnReset(err error) bool { return errors.Is(err, syscall.ECONNRESET) }
