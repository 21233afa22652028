// Package redistest starts real redis-server processes for tests: a
// standalone server, or a small Redis Cluster, each on free ports of
// 127.0.0.1, with no persistence, stopped when the test ends. Tests never
// use a server they did not start.
//
// When redis-server is not installed the test is skipped, or fails when
// $FLOODGATE_REQUIRE_REDIS is 1 (floodgate's test script sets it in CI).
//
// The environment chooses the server and the user the tests run as, so
// that scripts/test can run the same suites several ways:
//   - $FLOODGATE_REDIS_SERVER names the server binary (default
//     redis-server; valkey-server runs them on Valkey). Sentinels are the
//     same binary with --sentinel. $FLOODGATE_REDIS_CLI names the cli
//     (default valkey-cli for a valkey server, else redis-cli).
//   - $FLOODGATE_REDIS_ACL=1 creates, on every server started, the user
//     "floodgate" with exactly the store's ACL commands
//     (redisstore.ACLCommands) on every key, and Client, URL and the
//     Sentinel's URL log in as it; Admin stays the default user, for what
//     tests do beyond the store (CONFIG SET, FLUSHALL, SLOWLOG, DEBUG).
package redistest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/floodgate/floodgate/internal/lib/redisacl"
	"github.com/floodgate/floodgate/internal/testkit/tlstest"
	"github.com/redis/go-redis/v9"
)

// ACLUser and ACLPassword are the user Client logs in as when
// $FLOODGATE_REDIS_ACL is 1.
const (
	ACLUser     = "floodgate"
	ACLPassword = "floodgate-test"
)

// ServerBin returns the server binary the tests run:
// $FLOODGATE_REDIS_SERVER, or redis-server.
func ServerBin() string {
	if b := os.Getenv("FLOODGATE_REDIS_SERVER"); b != "" {
		return b
	}
	return "redis-server"
}

// CLIBin returns the cli matching ServerBin: $FLOODGATE_REDIS_CLI, or
// valkey-cli beside a valkey server, or redis-cli.
func CLIBin() string {
	if b := os.Getenv("FLOODGATE_REDIS_CLI"); b != "" {
		return b
	}
	if strings.HasPrefix(filepath.Base(ServerBin()), "valkey") {
		return "valkey-cli"
	}
	return "redis-cli"
}

// ACL reports whether the tests run as the ACL user
// ($FLOODGATE_REDIS_ACL=1).
func ACL() bool { return os.Getenv("FLOODGATE_REDIS_ACL") == "1" }

// Server is one redis-server process.
type Server struct {
	Addr string // host:port on 127.0.0.1
	// TLS is the client configuration of a server StartTLS started: the
	// test CA's and its client certificate; nil for the others.
	TLS  *tls.Config
	cmd  *exec.Cmd
	dir  string
	args []string
	pass string // the default user's, from --requirepass
	acl  bool   // the ACL user exists on it
}

func need(t testing.TB, bin string) string {
	t.Helper()
	p, err := exec.LookPath(bin)
	if err != nil {
		if os.Getenv("FLOODGATE_REQUIRE_REDIS") == "1" {
			t.Fatalf("%s not found: install it (Debian: apt-get install redis-server, or valkey-server from bookworm-backports); scripts/test does", bin)
		}
		t.Skipf("%s not found; skipping (scripts/test installs it)", bin)
	}
	return p
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start starts a standalone redis-server and stops it when t ends. Extra
// arguments are passed to redis-server ("--maxmemory", "1mb", ...).
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin := need(t, ServerBin())
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		s, err := start(t, bin, FreePort(t), extra)
		if err == nil {
			return s
		}
		last = err
	}
	t.Fatalf("starting %s: %v", bin, last)
	return nil
}

func start(t testing.TB, bin string, port int, extra []string) (*Server, error) {
	dir := t.TempDir()
	args := append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--daemonize", "no",
	}, extra...)
	s, err := launch(t, bin, port, dir, args, "redis.log", nil)
	if err != nil {
		return nil, err
	}
	if err := s.prepare(); err != nil {
		return nil, err
	}
	return s, nil
}

// StartTLS starts a standalone redis-server that speaks only TLS, with
// f's server certificate, and requires a client certificate from f's CA
// (tls-auth-clients yes, Redis's default), and stops it when t ends. Its
// TLS field is a client configuration that it accepts.
func StartTLS(t testing.TB, f tlstest.Files, extra ...string) *Server {
	t.Helper()
	bin := need(t, ServerBin())
	cfg := tlstest.ClientConfig(t, f, true)
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		s, err := startTLS(t, bin, FreePort(t), f, cfg, extra)
		if err == nil {
			return s
		}
		last = err
	}
	t.Fatalf("starting %s with TLS: %v", bin, last)
	return nil
}

func startTLS(t testing.TB, bin string, port int, f tlstest.Files, cfg *tls.Config, extra []string) (*Server, error) {
	dir := t.TempDir()
	args := append(append(tlsArgs(f, port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--daemonize", "no",
	), extra...)
	s, err := launch(t, bin, port, dir, args, "redis.log", cfg)
	if err != nil {
		return nil, err
	}
	if err := s.prepare(); err != nil {
		return nil, err
	}
	return s, nil
}

// tlsArgs are the arguments of a redis-server that speaks only TLS on
// port, with f's certificates, to its clients, its replicas and its
// Cluster bus, and requires client certificates.
func tlsArgs(f tlstest.Files, port int) []string {
	return []string{"--port", "0", "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", f.Cert, "--tls-key-file", f.Key, "--tls-ca-cert-file", f.CA, "--tls-auth-clients", "yes",
		"--tls-replication", "yes", "--tls-cluster", "yes"}
}

// prepare creates the ACL user under $FLOODGATE_REDIS_ACL=1 (launch
// noted the default user's password from --requirepass); on failure it
// stops the server.
func (s *Server) prepare() error {
	if ACL() {
		if err := s.createUser(); err != nil {
			s.Stop()
			return err
		}
		s.acl = true
	}
	return nil
}

// createUser creates the ACL user: the store's commands exactly, on every
// key (tests use many prefixes), and the lifts' channel.
func (s *Server) createUser() error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Password: s.pass, TLSConfig: s.TLS})
	defer c.Close()
	args := []any{"ACL", "SETUSER", ACLUser, "reset", "on", ">" + ACLPassword, "~*", "&" + redisacl.LiftsChannel}
	for _, r := range strings.Fields(redisacl.Commands) {
		args = append(args, r)
	}
	if err := c.Do(context.Background(), args...).Err(); err != nil {
		return fmt.Errorf("creating the ACL user on %s: %w", s.Addr, err)
	}
	return nil
}

// launch runs bin with args as a server on port, stopped when t ends, and
// waits until it answers PING, over TLS with tc when not nil; on failure
// the error carries its log file.
func launch(t testing.TB, bin string, port int, dir string, args []string, logName string, tc *tls.Config) (*Server, error) {
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), TLS: tc, cmd: cmd, dir: dir, args: args}
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--requirepass" {
			s.pass = args[i+1]
		}
	}
	t.Cleanup(s.Stop)
	err := waitPing(s.Addr, s.TLS, 5*time.Second)
	if err == nil {
		err = s.ours()
	}
	if err != nil {
		s.Stop()
		log, _ := os.ReadFile(filepath.Join(dir, logName))
		return nil, fmt.Errorf("%w\n%s", err, log)
	}
	return s, nil
}

// ours returns an error when the server that answers at s.Addr is
// another process than s's: the port was free a moment ago (FreePort),
// and another test's server, in this process or a package's test binary
// beside it, may have taken it meanwhile, while s's failed to bind. Its
// PING would pass for s's, and two tests would share one server. A
// server that does not answer INFO without a password tells nothing,
// and passes.
func (s *Server) ours() error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Password: s.pass, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, TLSConfig: s.TLS})
	defer c.Close()
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		return nil
	}
	_, rest, ok := strings.Cut(info, "process_id:")
	if !ok {
		return nil
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(rest, "\n", 2)[0]))
	if pid != s.cmd.Process.Pid {
		return fmt.Errorf("the server at %s is process %d, not the one started (%d): the port was taken", s.Addr, pid, s.cmd.Process.Pid)
	}
	return nil
}

func waitPing(addr string, tc *tls.Config, within time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, TLSConfig: tc})
	defer c.Close()
	var err error
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		// NOAUTH is an answer too: the server is up and wants a password.
		if err = c.Ping(context.Background()).Err(); err == nil || strings.HasPrefix(err.Error(), "NOAUTH") {
			return nil
		}
	}
	return fmt.Errorf("redis at %s did not answer PING within %s: %w", addr, within, err)
}

// Stop kills the server and waits for it. It is safe to call twice.
func (s *Server) Stop() {
	if s.cmd.Process == nil || s.cmd.ProcessState != nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
}

// Kill kills the server with SIGKILL, as a crash would, and waits for it.
func (s *Server) Kill() { s.Stop() }

// Restart starts the server again, empty, on the same address with the
// same arguments, after Kill or Stop, and waits until it answers PING.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		cmd := exec.Command(s.cmd.Path, s.args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err = cmd.Start(); err != nil {
			break
		}
		s.cmd = cmd
		if err = waitPing(s.Addr, s.TLS, 2*time.Second); err == nil {
			err = s.ours()
		}
		if err == nil {
			if s.acl {
				if err := s.createUser(); err != nil {
					t.Fatal(err)
				}
			}
			return
		}
		s.Stop() // the port may still be held: try again
	}
	t.Fatalf("restarting %s on %s: %v", s.cmd.Path, s.Addr, err)
}

// Signal sends sig to the server (SIGSTOP to make it hang, SIGCONT to
// resume it).
func (s *Server) Signal(sig syscall.Signal) error { return s.cmd.Process.Signal(sig) }

// Client returns a client for the server, closed when t ends: as the ACL
// user when $FLOODGATE_REDIS_ACL is 1, else as the default user.
func (s *Server) Client(t testing.TB) *redis.Client {
	o := &redis.Options{Addr: s.Addr, Password: s.pass, TLSConfig: s.TLS}
	if s.acl {
		o.Username, o.Password = ACLUser, ACLPassword
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// Admin returns a client for the server as the default user, allowed
// every command, closed when t ends.
func (s *Server) Admin(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Password: s.pass, TLSConfig: s.TLS})
	t.Cleanup(func() { c.Close() })
	return c
}

// URL returns the server's redis:// URL, with the ACL user's name and
// password when $FLOODGATE_REDIS_ACL is 1.
func (s *Server) URL() string {
	if s.acl {
		return "redis://" + ACLUser + ":" + ACLPassword + "@" + s.Addr
	}
	if s.pass != "" {
		return "redis://:" + s.pass + "@" + s.Addr
	}
	return "redis://" + s.Addr
}

// User returns the user name and password Client logs in with ("" for
// the default user without a password).
func (s *Server) User() (name, password string) {
	if s.acl {
		return ACLUser, ACLPassword
	}
	return "", s.pass
}

// Cluster is a Redis Cluster of masters, with no replicas unless
// StartClusterReplicas started it.
type Cluster struct {
	Addrs   []string
	Servers []*Server   // every node: the masters first, as created
	TLS     *tls.Config // a client configuration its nodes accept; nil without TLS
}

// StartCluster starts a cluster of the given number of masters (3 at
// least) and waits until it serves every slot. Its nodes keep serving
// their own slots when another master is down
// (cluster-require-full-coverage no), as a deployment that wants one
// dead master to cost only its own keys must set.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	return startCluster(t, masters, 0, nil)
}

// StartClusterReplicas is StartCluster with one replica of each master
// (Servers holds the masters, then the replicas), and waits until every
// replica is in sync with its master, so that a failover can happen.
func StartClusterReplicas(t testing.TB, masters int) *Cluster {
	t.Helper()
	return startCluster(t, masters, 1, nil)
}

// StartTLSCluster is StartCluster with nodes that speak only TLS, to
// clients and on the Cluster bus, as StartTLS's do. Its TLS field is a
// client configuration that they accept.
func StartTLSCluster(t testing.TB, masters int, f tlstest.Files) *Cluster {
	t.Helper()
	return startCluster(t, masters, 0, &f)
}

func startCluster(t testing.TB, masters, replicas int, f *tlstest.Files) *Cluster {
	t.Helper()
	bin := need(t, ServerBin())
	cli := need(t, CLIBin())
	c := &Cluster{}
	var cliTLS []string
	if f != nil {
		c.TLS = tlstest.ClientConfig(t, *f, true)
		cliTLS = []string{"--tls", "--cacert", f.CA, "--cert", f.ClientCert, "--key", f.ClientKey}
	}
	clusterArgs := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no"}
	for i := 0; i < masters*(1+replicas); i++ {
		var s *Server
		var err error
		for attempt := 0; attempt < 5; attempt++ {
			port := FreePort(t)
			if f == nil {
				s, err = start(t, bin, port, clusterArgs)
			} else {
				s, err = startTLS(t, bin, port, *f, c.TLS, clusterArgs)
			}
			if err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("starting cluster node: %v", err)
		}
		c.Servers = append(c.Servers, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	args := append(append(cliTLS, "--cluster", "create"), c.Addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	// Bounded: redis-cli waits for ever for nodes that cannot meet.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s --cluster create: %v\n%s", cli, err, out)
	}
	for _, addr := range c.Addrs {
		if err := waitClusterOK(addr, c.TLS, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range c.Servers[masters:] {
		rc := redis.NewClient(&redis.Options{Addr: s.Addr, TLSConfig: c.TLS})
		err := waitFor(15*time.Second, func() error {
			if info := rc.Info(context.Background(), "replication").Val(); !strings.Contains(info, "master_link_status:up") {
				return fmt.Errorf("replica %s is not in sync:\n%s", s.Addr, info)
			}
			return nil
		})
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// NodeID returns the Cluster node ID of the node at addr.
func (c *Cluster) NodeID(t testing.TB, addr string) string {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: c.TLS})
	defer rc.Close()
	id, err := rc.ClusterMyID(context.Background()).Result()
	if err != nil {
		t.Fatalf("CLUSTER MYID on %s: %v", addr, err)
	}
	return id
}

// Reshard moves slots slots from the master at from to the master at to
// with the cli's --cluster reshard, keys and all, as an operator would,
// and returns when it is done (within limit).
func (c *Cluster) Reshard(t testing.TB, from, to string, slots int, limit time.Duration) {
	t.Helper()
	cli := need(t, CLIBin())
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	args := []string{"--cluster", "reshard", from, "--cluster-from", c.NodeID(t, from), "--cluster-to", c.NodeID(t, to),
		"--cluster-slots", strconv.Itoa(slots), "--cluster-yes"}
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Errorf("%s %s: %v\n%s", cli, strings.Join(args, " "), err, tail(out, 2000))
	}
}

// tail returns the last n bytes of b at most.
func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// Failover makes the replica at addr its master's master with CLUSTER
// FAILOVER (the coordinated failover: the master stops taking writes
// until the replica has them all), and waits until every node of the
// cluster says so and serves every slot.
func (c *Cluster) Failover(t testing.TB, addr string) {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: c.TLS})
	defer rc.Close()
	ctx := context.Background()
	if err := rc.ClusterFailover(ctx).Err(); err != nil {
		t.Fatalf("CLUSTER FAILOVER on %s: %v", addr, err)
	}
	id := c.NodeID(t, addr)
	err := waitFor(20*time.Second, func() error {
		for _, a := range c.Addrs {
			nc := redis.NewClient(&redis.Options{Addr: a, TLSConfig: c.TLS})
			nodes, err := nc.ClusterNodes(ctx).Result()
			info := nc.ClusterInfo(ctx).Val()
			nc.Close()
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return fmt.Errorf("%s: cluster state not ok", a)
			}
			for _, line := range strings.Split(nodes, "\n") {
				if f := strings.Fields(line); len(f) > 2 && f[0] == id && !strings.Contains(f[2], "master") {
					return fmt.Errorf("%s sees %s as %s", a, addr, f[2])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("failover to %s: %v", addr, err)
	}
}

func waitClusterOK(addr string, tc *tls.Config, within time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: tc})
	defer c.Close()
	info := ""
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		info, _ = c.ClusterInfo(context.Background()).Result()
		if strings.Contains(info, "cluster_state:ok") {
			return nil
		}
	}
	return fmt.Errorf("cluster node %s not ok within %s:\n%s", addr, within, info)
}

// Client returns a cluster client, closed when t ends: as the ACL user
// when $FLOODGATE_REDIS_ACL is 1.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	o := &redis.ClusterOptions{Addrs: c.Addrs, TLSConfig: c.TLS}
	o.Username, o.Password = c.Servers[0].User()
	cc := redis.NewClusterClient(o)
	t.Cleanup(func() { cc.Close() })
	return cc
}

// URL returns the cluster's redis+cluster:// URL naming every node, with
// the ACL user's name and password when $FLOODGATE_REDIS_ACL is 1.
func (c *Cluster) URL() string {
	u := "redis+cluster://"
	if user, pass := c.Servers[0].User(); user != "" {
		u += user + ":" + pass + "@"
	}
	u += c.Addrs[0]
	for i, a := range c.Addrs[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u += sep + "addr=" + a
	}
	return u
}

// Admin returns a cluster client as the default user, closed when t ends.
func (c *Cluster) Admin(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, TLSConfig: c.TLS})
	t.Cleanup(func() { cc.Close() })
	return cc
}

// Sentinel is a master, one replica and three Sentinels watching them.
type Sentinel struct {
	TLS        *tls.Config // a client configuration every server accepts; nil without TLS
	MasterName string
	Master     *Server
	Replica    *Server
	Sentinels  []*Server
}

// StartSentinel starts a master, a replica of it and three Sentinels
// (redis-server --sentinel) that monitor it as "mymaster" with a quorum of
// two, and waits until each Sentinel knows the replica and the others, so
// that a failover can happen.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	return startSentinelSet(t, nil)
}

// StartTLSSentinel is StartSentinel with a master, a replica and Sentinels
// that speak only TLS, to clients and to each other, as StartTLS's do.
func StartTLSSentinel(t testing.TB, f tlstest.Files) *Sentinel {
	t.Helper()
	return startSentinelSet(t, &f)
}

func startSentinelSet(t testing.TB, f *tlstest.Files) *Sentinel {
	t.Helper()
	bin := need(t, ServerBin())
	startServer := Start
	if f != nil {
		startServer = func(t testing.TB, extra ...string) *Server { return StartTLS(t, *f, extra...) }
	}
	// Redis waits 5s before a diskless sync, to gather replicas; the
	// replica must hold the master's data before a failover. The master
	// refuses writes once no replica is connected (min-replicas-to-write
	// 1), as docs/redis.md advises: after a promotion, the old master then
	// stops deciding at once instead of admitting what the new master
	// never learns of.
	s := &Sentinel{MasterName: "mymaster", Master: startServer(t, "--repl-diskless-sync-delay", "0", "--min-replicas-to-write", "1", "--min-replicas-max-lag", "1")}
	s.TLS = s.Master.TLS
	s.Replica = startServer(t, "--replicaof", "127.0.0.1", strings.TrimPrefix(s.Master.Addr, "127.0.0.1:"))
	rc := redis.NewClient(&redis.Options{Addr: s.Replica.Addr, TLSConfig: s.TLS})
	err := waitFor(15*time.Second, func() error {
		if info := rc.Info(context.Background(), "replication").Val(); !strings.Contains(info, "master_link_status:up") {
			return fmt.Errorf("the replica is not in sync:\n%s", info)
		}
		return nil
	})
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	masterPort := strings.TrimPrefix(s.Master.Addr, "127.0.0.1:")
	for range 3 {
		var sen *Server
		var err error
		for attempt := 0; attempt < 5 && sen == nil; attempt++ {
			sen, err = startSentinel(t, bin, FreePort(t), masterPort, f)
		}
		if sen == nil {
			t.Fatalf("starting a sentinel: %v", err)
		}
		s.Sentinels = append(s.Sentinels, sen)
	}
	for _, sen := range s.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: sen.Addr, TLSConfig: s.TLS})
		err := waitFor(15*time.Second, func() error {
			reps, err := c.Replicas(context.Background(), s.MasterName).Result()
			if err == nil && len(reps) == 0 {
				err = fmt.Errorf("no replica known yet")
			}
			if err != nil {
				return err
			}
			sens, err := c.Sentinels(context.Background(), s.MasterName).Result()
			if err == nil && len(sens) < 2 {
				err = fmt.Errorf("%d other sentinels known", len(sens))
			}
			return err
		})
		c.Close()
		if err != nil {
			t.Fatalf("sentinel %s: %v", sen.Addr, err)
		}
	}
	return s
}

func startSentinel(t testing.TB, bin string, port int, masterPort string, f *tlstest.Files) (*Server, error) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	listen := fmt.Sprintf("port %d", port)
	var tc *tls.Config
	if f != nil {
		// tls-replication: a Sentinel speaks TLS to the servers it watches.
		listen = fmt.Sprintf("port 0\ntls-port %d\ntls-cert-file %s\ntls-key-file %s\ntls-ca-cert-file %s\ntls-auth-clients yes\ntls-replication yes",
			port, f.Cert, f.Key, f.CA)
		tc = tlstest.ClientConfig(t, *f, true)
	}
	err := os.WriteFile(conf, []byte(fmt.Sprintf(`%s
bind 127.0.0.1
dir %s
logfile %s
daemonize no
sentinel monitor mymaster 127.0.0.1 %s 2
sentinel down-after-milliseconds mymaster 1000
sentinel failover-timeout mymaster 10000
sentinel parallel-syncs mymaster 1
`, listen, dir, filepath.Join(dir, "sentinel.log"), masterPort)), 0o600)
	if err != nil {
		return nil, err
	}
	return launch(t, bin, port, dir, []string{conf, "--sentinel"}, "sentinel.log", tc)
}

// URL is the redis+sentinel:// URL of the master, naming every Sentinel;
// with $FLOODGATE_REDIS_ACL=1 it logs in to the master as the ACL user
// (the Sentinels themselves have no users).
func (s *Sentinel) URL() string {
	u := "redis+sentinel://" + s.Sentinels[0].Addr + "/0?master_name=" + s.MasterName
	for _, sen := range s.Sentinels[1:] {
		u += "&addr=" + sen.Addr
	}
	if s.Master.acl {
		u += "&username=" + ACLUser + "&password=" + ACLPassword
	}
	return u
}

// MasterAddr returns the master's address as the first Sentinel reports
// it.
func (s *Sentinel) MasterAddr() (string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinels[0].Addr, TLSConfig: s.TLS})
	defer c.Close()
	a, err := c.GetMasterAddrByName(context.Background(), s.MasterName).Result()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(a[0], a[1]), nil
}

// Failover asks the first Sentinel to fail the master over to its
// replica (SENTINEL FAILOVER), and waits until the Sentinels name the
// replica as master.
func (s *Sentinel) Failover(t testing.TB) {
	t.Helper()
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinels[0].Addr, TLSConfig: s.TLS})
	defer c.Close()
	if err := c.Failover(context.Background(), s.MasterName).Err(); err != nil {
		t.Fatalf("SENTINEL FAILOVER: %v", err)
	}
	err := waitFor(20*time.Second, func() error {
		a, err := s.MasterAddr()
		if err == nil && a != s.Replica.Addr {
			err = fmt.Errorf("master still %s", a)
		}
		return err
	})
	if err != nil {
		t.Fatalf("failover: %v", err)
	}
}

// waitFor calls f every 50ms until it returns nil, for at most within.
func waitFor(within time.Duration, f func() error) error {
	var err error
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err = f(); err == nil {
			return nil
		}
	}
	return err
}

// StartCallgrind starts a standalone redis-server under valgrind's
// callgrind, for a measurement of the server's instructions
// (callgrind_control -z and -e on Pid), and stops it when t ends. Its
// profile is written to CallgrindOut (callgrind_annotate reads it).
func StartCallgrind(t testing.TB) *Server {
	t.Helper()
	bin, vg := need(t, ServerBin()), need(t, "valgrind")
	port := FreePort(t)
	dir := t.TempDir()
	args := []string{"--tool=callgrind", "--callgrind-out-file=" + filepath.Join(dir, "callgrind.out"), bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--daemonize", "no"}
	cmd := exec.Command(vg, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), cmd: cmd, dir: dir, args: args}
	t.Cleanup(s.Stop)
	if err := waitPing(s.Addr, nil, time.Minute); err != nil {
		t.Fatal(err)
	}
	return s
}

// Pid is the server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// CallgrindOut is the profile a server that StartCallgrind started writes.
func (s *Server) CallgrindOut() string { return filepath.Join(s.dir, "callgrind.out") }
