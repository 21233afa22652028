// Package statsd sends floodgate serve's statistics to a StatsD server,
// under the names envoyproxy/ratelimit gives them, as its gostats store
// and its DogStatsD sink send them: counters are summed in memory and
// flushed as deltas every interval (a counter that did not move is not
// sent), timers are sent a sample a line.
//
// Nothing here can slow a decision. Counting is an atomic add; timer
// samples go into a bounded queue, and a sample that finds it full is
// dropped and counted; the lines of a flush go into a bounded queue of
// packets that one goroutine writes to the network, and a packet that
// finds it full, or that the network refuses, is dropped and counted
// (Dropped). A StatsD server that is down or slow loses statistics, never
// decisions.
package statsd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate/floodgate/internal/lib/lograte"
)

// Defaults of Options.
const (
	// DefaultFlushInterval is how often counters are sent: 10s, as
	// envoyproxy/ratelimit's STATS_FLUSH_INTERVAL.
	DefaultFlushInterval = 10 * time.Second
	// MaxQueuedPackets bounds the packets waiting to be written: at most
	// about 4 MiB over TCP, 1.4 MiB over UDP, as gostats bounds its own.
	MaxQueuedPackets = 1024
	// MaxQueuedSamples bounds the timer samples waiting for a flush.
	MaxQueuedSamples = 4096
	// maxNames bounds the counters and timers a Sink keeps: names come
	// from the configuration and, with detailed_metric, from requests
	// (the caller bounds those; this bounds the rest).
	maxNames = 20000
)

// packetSize is the most bytes of lines one write carries: a datagram
// that is not fragmented on an Ethernet path for UDP (as gostats and
// datadog-go size theirs), 64 KiB over TCP.
func packetSize(network string) int {
	if strings.HasPrefix(network, "udp") {
		return 1432
	}
	return 64 << 10
}

// Mogrifier rewrites a stat's name into a name and DogStatsD tags, as
// envoyproxy/ratelimit's DOG_STATSD_MOGRIFIER_<NAME>_{PATTERN,NAME,TAGS}
// do: the first whose Pattern matches a name applies, and $0, $1, ... in
// Name and in the tags' values are the pattern's submatches.
type Mogrifier struct {
	// Pattern is matched against the stat's name, without its tags.
	Pattern *regexp.Regexp
	// Name is the name sent.
	Name string
	// Tags are added to the stat's tags: key and value template.
	Tags map[string]string
}

// Options configure a Sink.
type Options struct {
	// Addr is the StatsD server's host:port. Required.
	Addr string
	// Network is "udp" (the default) or "tcp" (envoyproxy/ratelimit's
	// gostats default, STATSD_PROTOCOL). A TCP connection that fails is
	// dialled again at the next flush.
	Network string
	// Tags are added to every stat: envoyproxy/ratelimit's EXTRA_TAGS.
	// In plain StatsD they join the name as gostats writes them
	// (.__key=value, sorted by key); with DogStatsD they are tags.
	Tags map[string]string
	// DogStatsD sends tags as DogStatsD does (name:1|c|#key:value),
	// as envoyproxy/ratelimit's USE_DOG_STATSD.
	DogStatsD bool
	// Mogrifiers rewrite names into names and tags, with DogStatsD only.
	Mogrifiers []Mogrifier
	// FlushInterval is how often counters are sent. Default:
	// DefaultFlushInterval.
	FlushInterval time.Duration
	// Logger receives write failures, a line a minute at most with the
	// count held back. Default: slog.Default().
	Logger *slog.Logger
}

// Sink sends statistics to a StatsD server; New starts it, Close stops it
// after a last flush. It is safe for concurrent use.
type Sink struct {
	o       Options
	size    int
	suffix  string // plain StatsD: the tags, serialized into every name
	dogTags string // DogStatsD: "|#k:v,..." of Options.Tags, or ""

	mu       sync.Mutex // guards counters' and timers' maps, not their values
	counters map[string]*Counter
	funcs    []*counterFunc
	timers   map[string]*Timer
	samples  chan sample

	packets chan []byte
	dropped atomic.Uint64
	sent    atomic.Uint64

	conn   net.Conn // the writer's; nil when not connected
	log    *slog.Logger
	stop   chan struct{}
	done   sync.WaitGroup
	closed sync.Once
}

// Counter is a StatsD counter: Add never blocks.
type Counter struct {
	name string // as sent, with the tags
	n    atomic.Uint64
}

// Add adds n to the counter; the sum since the last flush is sent at the
// next one.
func (c *Counter) Add(n uint64) {
	if c != nil {
		c.n.Add(n)
	}
}

type counterFunc struct {
	name string
	f    func() uint64
	last uint64
}

// Timer is a StatsD timer, in milliseconds, as gostats's: each sample is a
// line.
type Timer struct {
	name string
	s    *Sink
}

type sample struct {
	t  *Timer
	ms float64
}

// Record queues a sample of d for the next flush, or drops and counts it
// when MaxQueuedSamples wait already.
func (t *Timer) Record(d time.Duration) {
	if t == nil {
		return
	}
	select {
	case t.s.samples <- sample{t: t, ms: float64(d.Milliseconds())}: // whole ms, as upstream records them
	default:
		t.s.dropped.Add(1)
	}
}

// New returns a Sink sending to o.Addr, and starts its goroutines. For
// UDP the address is resolved now; an error is an address or option that
// cannot work. Over TCP a server that is not up yet is dialled at each
// flush until it is.
func New(o Options) (*Sink, error) {
	if o.Network == "" {
		o.Network = "udp"
	}
	switch o.Network {
	case "udp", "tcp":
	default:
		return nil, fmt.Errorf("statsd: network %q is not udp or tcp", o.Network)
	}
	if _, _, err := net.SplitHostPort(o.Addr); err != nil {
		return nil, fmt.Errorf("statsd: address %q is not host:port: %w", o.Addr, err)
	}
	if o.FlushInterval == 0 {
		o.FlushInterval = DefaultFlushInterval
	}
	if o.FlushInterval < 0 {
		return nil, fmt.Errorf("statsd: flush interval %s is negative", o.FlushInterval)
	}
	if len(o.Mogrifiers) > 0 && !o.DogStatsD {
		return nil, errors.New("statsd: mogrifiers need DogStatsD")
	}
	for k, v := range o.Tags {
		if k == "" || v == "" {
			return nil, fmt.Errorf("statsd: tag %q:%q has an empty key or value", k, v)
		}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Sink{
		o: o, size: packetSize(o.Network),
		counters: map[string]*Counter{}, timers: map[string]*Timer{},
		samples: make(chan sample, MaxQueuedSamples),
		packets: make(chan []byte, MaxQueuedPackets),
		log:     slog.New(lograte.NewHandler(o.Logger.Handler(), time.Minute, nil)),
		stop:    make(chan struct{}),
	}
	keys := make([]string, 0, len(o.Tags))
	for k := range o.Tags {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if o.DogStatsD {
			if i == 0 {
				b.WriteString("|#")
			} else {
				b.WriteByte(',')
			}
			b.WriteString(k + ":" + o.Tags[k])
		} else {
			// gostats: ".__key=value", the value's . : | made _.
			b.WriteString(".__" + k + "=" + cleanTag(o.Tags[k]))
		}
	}
	if o.DogStatsD {
		s.dogTags = b.String()
	} else {
		s.suffix = b.String()
	}
	if o.Network == "udp" {
		c, err := net.Dial("udp", o.Addr)
		if err != nil {
			return nil, fmt.Errorf("statsd: %w", err)
		}
		s.conn = c
	}
	s.done.Add(2)
	go s.flushLoop()
	go s.writeLoop()
	return s, nil
}

// cleanTag replaces what StatsD names cannot hold in a tag's value, as
// gostats does.
func cleanTag(v string) string {
	return strings.NewReplacer(".", "_", ":", "_", "|", "_").Replace(v)
}

// Counter returns the counter named name (envoyproxy/ratelimit's name,
// such as ratelimit.service.rate_limit.edge.remote_address.total_hits),
// made on first use. Past maxNames names it returns nil, whose Add does
// nothing.
func (s *Sink) Counter(name string) *Counter {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.counters[name]; ok {
		return c
	}
	if len(s.counters)+len(s.timers) >= maxNames {
		return nil
	}
	c := &Counter{name: name}
	s.counters[name] = c
	return c
}

// CounterFunc sends, at each flush, how much f grew since the last one:
// for counts kept elsewhere (reloads), read only when flushing.
func (s *Sink) CounterFunc(name string, f func() uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.funcs = append(s.funcs, &counterFunc{name: name, f: f})
}

// Timer returns the timer named name, made on first use; nil past
// maxNames.
func (s *Sink) Timer(name string) *Timer {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.timers[name]; ok {
		return t
	}
	if len(s.counters)+len(s.timers) >= maxNames {
		return nil
	}
	t := &Timer{name: name, s: s}
	s.timers[name] = t
	return t
}

// Dropped returns how many timer samples and packets were dropped: their
// queue was full, or the network refused them.
func (s *Sink) Dropped() uint64 { return s.dropped.Load() }

// Sent returns how many packets were written.
func (s *Sink) Sent() uint64 { return s.sent.Load() }

// Close flushes what was counted, sends what is queued (a second at
// most), and stops the Sink's goroutines. It may be called more than once.
func (s *Sink) Close() error {
	s.closed.Do(func() {
		close(s.stop)
		s.done.Wait()
	})
	return nil
}

func (s *Sink) flushLoop() {
	defer s.done.Done()
	defer close(s.packets) // the writer sends what is left, then stops
	tick := time.NewTicker(s.o.FlushInterval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			s.Flush()
		case <-s.stop:
			s.Flush()
			return
		}
	}
}

// Flush sends what was counted since the last flush, and the timer
// samples queued. The Sink's own goroutine calls it every FlushInterval;
// tests call it to send now.
func (s *Sink) Flush() {
	var p packer
	p.s = s
	s.mu.Lock()
	for _, c := range s.counters {
		if n := c.n.Swap(0); n != 0 {
			p.line(c.name, strconv.FormatUint(n, 10), "c")
		}
	}
	for _, f := range s.funcs {
		v := f.f()
		if v > f.last {
			p.line(f.name, strconv.FormatUint(v-f.last, 10), "c")
		}
		f.last = v
	}
	s.mu.Unlock()
	for {
		select {
		case sm := <-s.samples:
			p.line(sm.t.name, strconv.FormatFloat(sm.ms, 'f', -1, 64), "ms")
			continue
		default:
		}
		break
	}
	p.end()
}

// packer gathers lines into packets of at most the sink's size.
type packer struct {
	s   *Sink
	buf []byte
}

func (p *packer) line(name, value, kind string) {
	l := p.s.format(name, value, kind)
	if len(p.buf)+len(l) > p.s.size && len(p.buf) > 0 {
		p.end()
	}
	p.buf = append(p.buf, l...)
}

func (p *packer) end() {
	if len(p.buf) == 0 {
		return
	}
	select {
	case p.s.packets <- p.buf:
	default:
		p.s.dropped.Add(1)
	}
	p.buf = nil
}

// format returns one StatsD line: name:value|kind, the name with the
// tags as gostats serializes them, or DogStatsD's |#tags, after the
// mogrifiers.
func (s *Sink) format(name, value, kind string) string {
	if !s.o.DogStatsD {
		return name + s.suffix + ":" + value + "|" + kind + "\n"
	}
	tags := s.dogTags
	for _, m := range s.o.Mogrifiers {
		sub := m.Pattern.FindStringSubmatch(name)
		if sub == nil {
			continue
		}
		name = expand(m.Name, sub)
		keys := make([]string, 0, len(m.Tags))
		for k := range m.Tags {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if tags == "" {
				tags = "|#"
			} else {
				tags += ","
			}
			tags += k + ":" + expand(m.Tags[k], sub)
		}
		break
	}
	return name + ":" + value + "|" + kind + tags + "\n"
}

var submatchRef = regexp.MustCompile(`\$\d+`)

// expand replaces $0, $1, ... in tmpl with sub's submatches; a reference
// past them stays as written, as envoyproxy/ratelimit leaves it.
func expand(tmpl string, sub []string) string {
	return submatchRef.ReplaceAllStringFunc(tmpl, func(ref string) string {
		i, err := strconv.Atoi(ref[1:])
		if err != nil || i >= len(sub) {
			return ref
		}
		return sub[i]
	})
}

// writeLoop writes the packets, in order, until the flusher closes their
// queue; a packet that cannot be written is dropped and counted.
func (s *Sink) writeLoop() {
	defer s.done.Done()
	defer func() {
		if s.conn != nil {
			s.conn.Close()
		}
	}()
	var failedAt time.Time // the last failed dial: none again for a second
	for b := range s.packets {
		if s.conn == nil && !failedAt.IsZero() && time.Since(failedAt) < writeTimeout {
			s.dropped.Add(1) // the server was down a moment ago: no dial per packet
			continue
		}
		if err := s.write(b); err != nil {
			if s.conn == nil {
				failedAt = time.Now()
			}
			s.dropped.Add(1)
			s.log.Warn("floodgate: StatsD write failed; statistics dropped", "addr", s.o.Addr, "network", s.o.Network, "error", err.Error())
			continue
		}
		s.sent.Add(1)
	}
}

// writeTimeout bounds one write, so that a StatsD server that stops
// reading holds one packet at most, and Close ends.
const writeTimeout = time.Second

func (s *Sink) write(b []byte) error {
	if s.conn == nil { // TCP, not connected yet or since a failure
		ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
		c, err := (&net.Dialer{}).DialContext(ctx, s.o.Network, s.o.Addr)
		cancel()
		if err != nil {
			return err
		}
		s.conn = c
	}
	s.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := s.conn.Write(b); err != nil {
		if s.o.Network == "tcp" {
			s.conn.Close()
			s.conn = nil
		}
		return err
	}
	return nil
}

// ParseTags reads tags written as envoyproxy/ratelimit's EXTRA_TAGS and
// mogrifiers' TAGS are: "key:value,key2:value2" (a pair without ":" is an
// error; spaces around a pair are trimmed).
func ParseTags(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		if pair == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, ":")
		if !ok || k == "" {
			return nil, fmt.Errorf("tag %q is not key:value", pair)
		}
		out[k] = v
	}
	return out, nil
}
