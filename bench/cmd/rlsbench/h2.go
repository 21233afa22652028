package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"time"

	rls "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The envoy load generator calls ShouldRateLimit as Envoy does: one
// HTTP/2 connection, every caller a stream on it, driven by one event
// loop (Envoy's worker thread) that writes what it has to send in one
// system call and reads every answer that has arrived in another. Its
// requests are gRPC on the wire, byte for byte what a gRPC client sends;
// only the client side is lean. The generator shares the machine's two
// cores with the service it measures, and a gRPC-Go client's cost per
// call (goroutines, a writer loop, a timer per deadline) was taken from
// both services alike, where Envoy's own cost is on other machines. The
// -client grpc generator (runGRPC) is kept, for comparison.

// rlsPath is the method's HTTP/2 path.
const rlsPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// payloads holds every client's request as a gRPC message on the wire
// (the 5-byte frame header, then the protobuf), by number of descriptors.
var payloads = [4][][]byte{1: grpcPayloads(requests[1]), 3: grpcPayloads(requests[3])}

func grpcPayloads(reqs []*rls.RateLimitRequest) [][]byte {
	out := make([][]byte, len(reqs))
	for i, req := range reqs {
		out[i] = grpcFrame(req)
	}
	return out
}

// grpcFrame returns m as one gRPC message on the wire: uncompressed, its
// length, then the protobuf.
func grpcFrame(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	p := make([]byte, 5, 5+len(b))
	binary.BigEndian.PutUint32(p[1:], uint32(len(b)))
	return append(p, b...)
}

// h2Window is the receive window the generator grants on the connection
// and on each stream: large, so that it is topped up rarely.
const h2Window = 1 << 30

// h2Caller is one caller's stream in flight.
type h2Caller struct {
	id     uint32 // its stream
	t0     time.Time
	body   []byte // the answer's DATA so far
	status string // grpc-status, once the trailers have come
}

// runH2 measures what runGRPC does with the Envoy-like generator: callers
// streams kept in flight on one connection for d, each caller sending its
// next request as soon as its answer comes.
func runH2(addr string, callers, descs int, d time.Duration) result {
	conn, err := net.Dial("tcp", addr)
	check(err)
	defer conn.Close()
	check(conn.SetDeadline(time.Now().Add(d + 10*time.Second)))
	bw := bufio.NewWriterSize(conn, 64<<10)
	br := bufio.NewReaderSize(conn, 64<<10)
	fr := http2.NewFramer(bw, br)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	headers := [...]hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: rlsPath},
		{Name: ":authority", Value: addr}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
		{Name: "grpc-timeout", Value: strconv.Itoa(int(envoyTimeout/time.Millisecond)) + "m"}}

	_, err = bw.WriteString(http2.ClientPreface)
	check(err)
	check(fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: h2Window}))
	check(fr.WriteWindowUpdate(0, h2Window-65535))

	rng := rand.New(rand.NewPCG(uint64(callers), uint64(time.Now().UnixNano())))
	cs := make([]h2Caller, callers)
	byStream := make(map[uint32]int, callers)
	nextID := uint32(1)
	sendWindow := int64(65535) // the connection's, granted by the service
	var waiting []int          // callers whose request waits for sendWindow
	var lat []time.Duration
	var over, errs, timedOut, unread int
	deadline := time.Now().Add(d)

	send := func(c int) {
		p := payloads[descs][rng.IntN(clients)]
		if int64(len(p)) > sendWindow {
			waiting = append(waiting, c)
			return
		}
		sendWindow -= int64(len(p))
		hbuf.Reset()
		for _, f := range headers {
			check(enc.WriteField(f))
		}
		id := nextID
		nextID += 2
		cs[c] = h2Caller{id: id, t0: time.Now(), body: cs[c].body[:0]}
		byStream[id] = c
		check(fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hbuf.Bytes(), EndHeaders: true}))
		check(fr.WriteData(id, true, p))
	}
	finish := func(c int, reset bool) {
		now := time.Now()
		lat = append(lat, now.Sub(cs[c].t0))
		delete(byStream, cs[c].id)
		switch {
		case reset || cs[c].status == "4": // DEADLINE_EXCEEDED, or the stream reset
			timedOut++
		case cs[c].status != "0":
			errs++
		default:
			code, ok := overallCode(cs[c].body)
			switch {
			case !ok:
				errs++
			case code == rls.RateLimitResponse_OVER_LIMIT:
				over++
			}
		}
		if now.Before(deadline) {
			send(c)
		}
	}

	start := time.Now()
	for c := range cs {
		send(c)
	}
	check(bw.Flush())
	for len(byStream) > 0 || len(waiting) > 0 {
		f, err := fr.ReadFrame()
		check(err)
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok && int(v) < callers {
					fail(fmt.Errorf("%s allows %d streams on a connection, fewer than %d callers", addr, v, callers))
				}
				if v, ok := f.Value(http2.SettingInitialWindowSize); ok && int(v) < 1<<10 {
					// A request is one DATA frame, sent whole: it must
					// fit in a new stream's window.
					fail(fmt.Errorf("%s grants a stream %d bytes, less than a request", addr, v))
				}
				if v, ok := f.Value(http2.SettingHeaderTableSize); ok {
					enc.SetMaxDynamicTableSizeLimit(v)
				}
				check(fr.WriteSettingsAck())
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				check(fr.WritePing(true, f.Data))
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				sendWindow += int64(f.Increment)
				ready := waiting
				waiting = nil
				for _, c := range ready {
					send(c)
				}
			}
		case *http2.MetaHeadersFrame:
			c, ok := byStream[f.StreamID]
			if !ok {
				break
			}
			if v := f.PseudoValue("status"); v != "" && v != "200" {
				fail(fmt.Errorf("%s answered HTTP status %s", addr, v))
			}
			for _, hf := range f.RegularFields() {
				if hf.Name == "grpc-status" {
					cs[c].status = hf.Value
				}
			}
			if f.StreamEnded() {
				finish(c, false)
			}
		case *http2.DataFrame:
			unread += int(f.Length)
			if unread > h2Window/2 {
				check(fr.WriteWindowUpdate(0, uint32(unread)))
				unread = 0
			}
			c, ok := byStream[f.StreamID]
			if !ok {
				break
			}
			cs[c].body = append(cs[c].body, f.Data()...)
			if f.StreamEnded() {
				finish(c, false)
			}
		case *http2.RSTStreamFrame:
			if c, ok := byStream[f.StreamID]; ok {
				finish(c, true)
			}
		case *http2.GoAwayFrame:
			fail(fmt.Errorf("%s sent GOAWAY: %v", addr, f.ErrCode))
		}
		if br.Buffered() == 0 {
			check(bw.Flush())
		}
	}
	return tally(lat, time.Since(start), over, errs, timedOut)
}

// overallCode reads RateLimitResponse.overall_code (field 1) from one
// gRPC message as the service sent it: uncompressed, one message. It
// reads that field alone rather than unmarshal the whole response, whose
// cost would come out of the cores the services share.
func overallCode(body []byte) (rls.RateLimitResponse_Code, bool) {
	if len(body) < 5 || body[0] != 0 || int(binary.BigEndian.Uint32(body[1:])) != len(body)-5 {
		return 0, false
	}
	b := body[5:]
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, false
			}
			return rls.RateLimitResponse_Code(v), true
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
	}
	return rls.RateLimitResponse_UNKNOWN, true // proto3 leaves a zero out
}
