package redistest

import (
	"net"
	"strconv"
	"strings"
	"testing"
)

// TestTakenPort: a server started on a port that another server holds
// fails to bind, and the other's answers do not pass for its own.
func TestTakenPort(t *testing.T) {
	srv := Start(t)
	_, p, err := net.SplitHostPort(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(p)
	if _, err := start(t, need(t, ServerBin()), port, nil); err == nil || !strings.Contains(err.Error(), "the port was taken") {
		t.Fatalf("start on a taken port: %v; want the port was taken", err)
	}
}
