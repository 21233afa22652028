package resp

import (
	"bufio"
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	"github.com/floodgate/floodgate"
	"github.com/floodgate/floodgate/internal/server/config"
	"github.com/floodgate/floodgate/internal/server/service"
	"github.com/floodgate/floodgate/storetest"
)

func TestSlotCommands(t *testing.T) {
	store := floodgate.NewMemoryStore(&floodgate.MemoryOptions{SweepInterval: -1, Clock: storetest.NewClock(storetest.Base)})
	defer store.Close()
	cfg, err := config.Parse("r.yaml", []byte("concurrency: [{name: llm, slots: 1, lease: 30s}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(store, cfg, &service.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := New(svc, &Options{Version: "test", Logger: slog.New(slog.DiscardHandler)})
	do := func(args ...string) string {
		var out bytes.Buffer
		c := &conn{s: srv, c: stubConn{}, ctx: context.Background(), r: bufio.NewReader(strings.NewReader("")),
			w: bufio.NewWriter(&out), proto: 2, authed: true}
		c.dispatch(args)
		c.w.Flush()
		return out.String()
	}
	got := do("FG.ACQUIRE", "llm", "u1")
	lines := strings.Split(got, "\r\n")
	if len(lines) < 7 || strings.Join(lines[:5], "|") != "*5|:1|:1|:1|:0" || len(lines[6]) != floodgate.PermitIDLen {
		t.Fatalf("FG.ACQUIRE: %q", got)
	}
	id := lines[6]
	exp := storetest.Base.UnixMilli() + 30000
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"FG.ACQUIRE", "llm", "u1"}, "*5\r\n:0\r\n:1\r\n:1\r\n:30000\r\n$-1\r\n"},
		{[]string{"FG.EXTEND", "llm", "u1", id}, "*3\r\n:1\r\n:1\r\n:" + itoa(exp) + "\r\n"},
		{[]string{"FG.RELEASE", "llm", "u1", id}, "*2\r\n:1\r\n:0\r\n"},
		{[]string{"FG.RELEASE", "llm", "u1", id}, "*2\r\n:0\r\n:0\r\n"},
		{[]string{"FG.EXTEND", "llm", "u1", id}, "*3\r\n:0\r\n:0\r\n:0\r\n"},
		{[]string{"FG.RELEASE", "llm", "u2", id}, "-ERR floodgate: invalid permit: permit"},
		{[]string{"FG.RELEASE", "llm", "u1", "nope"}, "-ERR floodgate: invalid permit: \"nope\" is not a permit id"},
		{[]string{"FG.RELEASE", "llm", "u1"}, "-ERR wrong number of arguments for 'fg.release' command"},
		{[]string{"FG.ACQUIRE", "llm"}, "-ERR wrong number of arguments for 'fg.acquire' command"},
		{[]string{"FG.ACQUIRE", "nope", "u1"}, "-ERR unknown rule \"nope\""},
		// FG.EXPLAIN takes a concurrency rule, and acquires nothing.
		{[]string{"FG.ACQUIRE", "llm", "u3"}, "*5\r\n:1\r\n"},
		{[]string{"FG.EXPLAIN", "llm", "u3"}, "*4\r\n$130\r\nkey \"u3\" is checked against concurrency rule \"llm\": 1 slot, each permit held until released, or for a lease of 30s unless extended\r\n$121\r\n1 of 1 slots are held now; the earliest permit expires in 30s"},
		{[]string{"FG.EXPLAIN", "llm", "u3", "JSON"}, `$`},
	} {
		if got := do(tc.args...); !strings.HasPrefix(got, tc.want) {
			t.Errorf("%v: %q, want %q", tc.args, got, tc.want)
		}
	}
	if got := do("FG.EXPLAIN", "llm", "u3", "JSON"); !strings.Contains(got, `"concurrency":{"slots":1,"lease_ms":30000,"held":1,"free_in_ms":30000}`) {
		t.Errorf("FG.EXPLAIN llm u3 JSON: %q", got)
	}
}

func itoa(i int64) string { return strconv.FormatInt(i, 10) }
