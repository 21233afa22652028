package statsd

import (
	"bufio"
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// udpListener is a StatsD server on a free loopback UDP port.
func udpListener(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// readLines reads datagrams until want lines came, or 5s passed.
func readLines(t *testing.T, c *net.UDPConn, want int) []string {
	t.Helper()
	var lines []string
	buf := make([]byte, 65536)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for len(lines) < want {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("after %d of %d lines: %v (%q)", len(lines), want, err, lines)
		}
		if n > 1432 {
			t.Errorf("a datagram of %d bytes, more than 1432", n)
		}
		lines = append(lines, strings.Split(strings.TrimSuffix(string(buf[:n]), "\n"), "\n")...)
	}
	slices.Sort(lines)
	return lines
}

func TestLines(t *testing.T) {
	const hits = "ratelimit.service.rate_limit.edge.remote_address.total_hits"
	for _, tc := range []struct {
		name string
		o    Options
		want []string
	}{
		{name: "plain", want: []string{hits + ":3|c", "ratelimit_server.ShouldRateLimit.response_time:12|ms"}},
		{name: "gostats tags", o: Options{Tags: map[string]string{"zone": "eu.1", "app": "rl"}},
			want: []string{hits + ".__app=rl.__zone=eu_1:3|c", "ratelimit_server.ShouldRateLimit.response_time.__app=rl.__zone=eu_1:12|ms"}},
		{name: "dogstatsd", o: Options{DogStatsD: true, Tags: map[string]string{"zone": "eu", "app": "rl"}},
			want: []string{hits + ":3|c|#app:rl,zone:eu", "ratelimit_server.ShouldRateLimit.response_time:12|ms|#app:rl,zone:eu"}},
		{name: "mogrifier", o: Options{DogStatsD: true, Tags: map[string]string{"app": "rl"}, Mogrifiers: []Mogrifier{{
			Pattern: regexp.MustCompile(`^ratelimit\.service\.rate_limit\.([^.]+)\.(.*)\.([^.]+)$`),
			Name:    "ratelimit.service.rate_limit.$3", Tags: map[string]string{"domain": "$1", "descriptor": "$2", "x": "$9"}}}},
			want: []string{"ratelimit.service.rate_limit.total_hits:3|c|#app:rl,descriptor:remote_address,domain:edge,x:$9", "ratelimit_server.ShouldRateLimit.response_time:12|ms|#app:rl"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := udpListener(t)
			o := tc.o
			o.Addr, o.FlushInterval = l.LocalAddr().String(), time.Hour
			s, err := New(o)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			c := s.Counter(hits)
			c.Add(1)
			c.Add(2)
			s.Counter("ratelimit.service.rate_limit.edge.path.over_limit") // never moves: never sent
			s.Timer("ratelimit_server.ShouldRateLimit.response_time").Record(12*time.Millisecond + 400*time.Microsecond)
			s.Flush()
			if got := readLines(t, l, 2); !slices.Equal(got, tc.want) {
				t.Errorf("lines %q, want %q", got, tc.want)
			}
			// A second flush sends what moved since the first only.
			c.Add(5)
			s.Flush()
			want := strings.Replace(tc.want[0], ":3|c", ":5|c", 1)
			if got := readLines(t, l, 1); !slices.Equal(got, []string{want}) {
				t.Errorf("after the second flush %q, want %q", got, want)
			}
		})
	}
}

// TestCounterFunc: a count kept elsewhere is sent as its growth.
func TestCounterFunc(t *testing.T) {
	l := udpListener(t)
	s, err := New(Options{Addr: l.LocalAddr().String(), FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var v uint64 = 1
	s.CounterFunc("ratelimit.service.config_load_success", func() uint64 { return v })
	s.Flush()
	v = 4
	s.Flush()
	if got := readLines(t, l, 2); !slices.Equal(got, []string{"ratelimit.service.config_load_success:1|c", "ratelimit.service.config_load_success:3|c"}) {
		t.Errorf("lines %q", got)
	}
}

// TestPackets: many names fill several datagrams, none over 1432 bytes,
// and every line arrives whole.
func TestPackets(t *testing.T) {
	l := udpListener(t)
	s, err := New(Options{Addr: l.LocalAddr().String(), FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 300
	for i := range n {
		s.Counter("ratelimit.service.rate_limit.edge.remote_address_10_0_0_" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + "." + strings.Repeat("y", i/26) + ".total_hits").Add(1)
	}
	s.Flush()
	lines := readLines(t, l, n)
	for _, line := range lines {
		if !strings.HasSuffix(line, ":1|c") {
			t.Fatalf("line %q cut", line)
		}
	}
}

// TestTCPFlushOnClose: over TCP, as envoyproxy/ratelimit's gostats
// sends by default, Close sends what was counted.
func TestTCPFlushOnClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, _ := bufio.NewReader(c).ReadString('\n')
		got <- line
	}()
	s, err := New(Options{Addr: ln.Addr().String(), Network: "tcp", FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s.Counter("ratelimit.service.rate_limit.edge.remote_address.over_limit").Add(7)
	s.Close()
	if line := <-got; line != "ratelimit.service.rate_limit.edge.remote_address.over_limit:7|c\n" {
		t.Errorf("TCP line %q", line)
	}
}

// TestNeverBlocks: with no StatsD server, and with more samples than the
// queue holds, counting and recording return at once, and what could not
// be sent is counted in Dropped.
func TestNeverBlocks(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	s, err := New(Options{Addr: addr, Network: "tcp", FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tm := s.Timer("ratelimit_server.ShouldRateLimit.response_time")
	for range MaxQueuedSamples + 10 {
		tm.Record(time.Millisecond)
	}
	if d := s.Dropped(); d != 10 {
		t.Errorf("Dropped = %d after %d samples, want 10", d, MaxQueuedSamples+10)
	}
	s.Counter("ratelimit.service.rate_limit.edge.x.total_hits").Add(1)
	s.Close() // the last flush's packets fail to connect: dropped
	if d := s.Dropped(); d <= 10 {
		t.Errorf("Dropped = %d after a flush with no server, want more than 10", d)
	}
	if s.Sent() != 0 {
		t.Errorf("Sent = %d with no server", s.Sent())
	}
}

func TestBadOptions(t *testing.T) {
	for _, o := range []Options{
		{Addr: "nohostport"},
		{Addr: "127.0.0.1:8125", Network: "sctp"},
		{Addr: "127.0.0.1:8125", FlushInterval: -time.Second},
		{Addr: "127.0.0.1:8125", Mogrifiers: []Mogrifier{{Pattern: regexp.MustCompile("x"), Name: "y"}}},
		{Addr: "127.0.0.1:8125", Tags: map[string]string{"k": ""}},
	} {
		if s, err := New(o); err == nil {
			s.Close()
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

func TestParseTags(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want map[string]string
		bad  bool
	}{
		{in: "", want: map[string]string{}},
		{in: "a:1, b:x:y", want: map[string]string{"a": "1", "b": "x:y"}},
		{in: "a", bad: true},
		{in: ":v", bad: true},
	} {
		got, err := ParseTags(tc.in)
		if (err != nil) != tc.bad {
			t.Errorf("ParseTags(%q) error %v", tc.in, err)
			continue
		}
		if !tc.bad && len(got) != len(tc.want) {
			t.Errorf("ParseTags(%q) = %v, want %v", tc.in, got, tc.want)
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("ParseTags(%q)[%q] = %q, want %q", tc.in, k, got[k], v)
			}
		}
	}
}
