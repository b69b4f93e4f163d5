package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
	"github.com/proteanhq/protean-host/partition"
)

// redisDeployment is a migrated PostgreSQL database and a Redis key prefix
// that several host instances share, as production.toml runs them.
type redisDeployment struct {
	dbURL, redisURL, prefix string
}

func newRedisDeployment(t *testing.T) redisDeployment {
	t.Helper()
	d := redisDeployment{dbURL: testserver.Postgres(t)}
	d.redisURL, d.prefix = testserver.Redis(t)
	t.Setenv(config.EnvDatabaseURL, d.dbURL)
	t.Setenv(config.EnvRedisURL, d.redisURL)
	code, _, errs := cli(t, "migrate", "--config", filepath.Join(wasmbuild.Root(), "configs", "production.toml"))
	require.Equal(t, 0, code, errs)
	return d
}

// startHosts starts n host instances of the deployment on the example
// modules, as production.toml runs them, with fastLeases.
func (d redisDeployment) startHosts(t *testing.T, n int) []*testHost {
	t.Helper()
	dir := wasmbuild.Examples(t)
	var hosts []*testHost
	for range n {
		h, err := startHostWith(t, "production.toml", dir, d.fastLeases)
		require.NoError(t, err)
		hosts = append(hosts, h)
	}
	return hosts
}

// fastLeases shortens the lease protocol's timing for tests.
func (d redisDeployment) fastLeases(c *config.Config) {
	withKeyPrefix(c, d.prefix)
	c.Server.Partitioning.LeaseTTLMS = 2000
	hb := 0.2
	c.Server.Partitioning.HeartbeatIntervalSeconds = &hb
	c.Server.Partitioning.PollIntervalSeconds = 0.01
}

// Commands accepted one after another for one client appear in that
// client's order_ids in acceptance order, with three instances relaying
// and consuming; a process manager correlates across two partitioned
// categories on them.
func TestRedisPartitionsAcrossThreeInstances(t *testing.T) {
	d := newRedisDeployment(t)
	hosts := d.startHosts(t, 3)
	const clients, perClient = 4, 6
	accepted := make([][]string, clients)
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perClient; i++ {
				h := hosts[(c+i)%len(hosts)]
				id := fmt.Sprintf("o-%d-%d", c, i)
				r, err := send("POST", "http://"+h.addr+"/v1/commands/PlaceOrder", fmt.Sprintf(`{"order_id":%q,"client_id":"c-%d","total":1}`, id, c))
				if err == nil && r.code != 200 {
					err = fmt.Errorf("PlaceOrder %s: %s", id, r)
				}
				if err != nil {
					errs <- err
					return
				}
				accepted[c] = append(accepted[c], id)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for c := 0; c < clients; c++ {
		want := accepted[c]
		eventually(t, hosts[0], fmt.Sprintf("client c-%d's orders projected in acceptance order", c), func() (bool, string) {
			r := get(t, hosts[c%3], fmt.Sprintf("/v1/projections/client_orders/c-%d", c))
			ids := stringsOf(r.body["order_ids"])
			return r.code == 200 && slices.Equal(ids, want), fmt.Sprintf("want %v, got %s", want, r)
		})
	}
	// Payment and shipment on different instances; the process manager
	// owns the correlation value across both categories.
	require.Equal(t, 200, post(t, hosts[1], "ShipOrder", `{"shipment_id":"s-1","order_id":"o-0-0"}`).code)
	require.Equal(t, 200, post(t, hosts[2], "RecordPayment", `{"payment_id":"p-1","order_id":"o-0-0","amount":1}`).code)
	eventually(t, hosts[0], "the order fulfilled", func() (bool, string) {
		r := get(t, hosts[0], "/v1/projections/fulfillment/o-0-0")
		return r.code == 200 && r.body["status"] == "fulfilled", r.String()
	})
	owned := 0
	for i, h := range hosts {
		n := len(h.partitions.Owned())
		t.Logf("instance %d owns %d partitions", i, n)
		owned += n
	}
	require.GreaterOrEqual(t, owned, clients, "every client's partition is owned by some instance")
	// Each instance reports its partitions; an owner reports its owned
	// partitions' lag by group (never by partition), 0 once it has handled
	// everything. The gauges move
	// after the work they report (and a partition can change hands in
	// between): wait for them.
	for i, h := range hosts {
		eventually(t, h, fmt.Sprintf("instance %d's partition metrics", i), func() (bool, string) {
			m := get(t, h, "/metrics").raw
			if !strings.Contains(m, "protean_partitions_halted") {
				return false, "no protean_partitions_halted"
			}
			for _, l := range h.partitions.Owned() {
				if !strings.Contains(m, fmt.Sprintf(`protean_partition_lag{group="%s"} 0`, l.Group)) ||
					!strings.Contains(m, fmt.Sprintf(`protean_partitions_lagging{group="%s"} 0`, l.Group)) ||
					!strings.Contains(m, fmt.Sprintf(`protean_partitions_owned{group="%s"}`, l.Group)) ||
					!strings.Contains(m, fmt.Sprintf(`protean_partition_lease_acquisitions_total{group="%s"}`, l.Group)) {
					return false, fmt.Sprintf("owns %s/%s:\n%s", l.Group, l.Unit, metricLines(m, "protean_partition"))
				}
			}
			return true, ""
		})
	}
	// One instance's relay held the broker's relay lease and published
	// every instance's rows; the others claimed nothing.
	var leading []int
	for i, h := range hosts {
		m := get(t, h, "/metrics").raw
		switch {
		case strings.Contains(m, `protean_outbox_relay_leading{broker="default"} 1`):
			leading = append(leading, i)
		case !strings.Contains(m, `protean_outbox_relay_leading{broker="default"} 0`):
			t.Fatalf("instance %d has no relay lease gauge:\n%s", i, metricLines(m, "protean_outbox"))
		}
	}
	require.Len(t, leading, 1, "instances whose relay holds the lease")
	// Every instance's status page names the lease's holder.
	for i, h := range hosts {
		page := get(t, h, "/").raw
		require.Regexp(t, `<p class="lease" data-broker="default">Relay lease of broker default: \S+ claims its rows \(\S+ left unless renewed\)</p>`, page, "instance %d's status page", i)
	}
	// Each instance LISTENs over one connection: its partition advances'
	// and, on the lease's holder, its relay's wake-ups (once two).
	db, err := pgx.Connect(t.Context(), d.dbURL)
	require.NoError(t, err)
	defer db.Close(context.Background())
	eventually(t, hosts[0], "one LISTEN session per instance", func() (bool, string) {
		var n int
		err := db.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND query LIKE 'LISTEN %'`).Scan(&n)
		return err == nil && n == len(hosts), fmt.Sprintf("%d sessions LISTENing, error %v", n, err)
	})
}

func stringsOf(v any) []string {
	var out []string
	if xs, ok := v.([]any); ok {
		for _, x := range xs {
			s, _ := x.(string)
			out = append(out, s)
		}
	}
	return out
}

// process is a host instance run as its own process, so that a test can
// kill it the way a machine dies: no drain, no lease release.
type process struct {
	cmd  *exec.Cmd
	addr string
	log  string
	done chan struct{}
}

// launchProcess runs the host binary with args (after "run --config cfg")
// and extra environment (KEY=VALUE), logging to dir/host.log. The test's
// cleanup kills it.
func launchProcess(t testing.TB, addr, cfg, dir string, args []string, env ...string) *process {
	t.Helper()
	p := &process{addr: addr, log: filepath.Join(dir, "host.log"), done: make(chan struct{})}
	logf, err := os.Create(p.log)
	require.NoError(t, err)
	p.cmd = exec.Command(hostBinary(t), append([]string{"run", "--config", cfg}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.Env = append(os.Environ(), env...)
	require.NoError(t, p.cmd.Start())
	go func() { _ = p.cmd.Wait(); _ = logf.Close(); close(p.done) }()
	t.Cleanup(func() { p.kill() })
	return p
}

// startProcess is launchProcess, then a wait until the instance answers
// /healthz at addr; a host that exits at start fails the test with its log.
func startProcess(t testing.TB, addr, cfg, dir string, args []string, env ...string) *process {
	t.Helper()
	p := launchProcess(t, addr, cfg, dir, args, env...)
	testwait.For(t, "instance at "+addr+" healthy", func() (bool, string) {
		select {
		case <-p.done:
			return true, ""
		default:
		}
		r, err := send("GET", "http://"+addr+"/healthz", "")
		return err == nil && r.code == 200, fmt.Sprintf("%v %v\n%s", r, err, p.Tail())
	})
	select {
	case <-p.done:
		t.Fatalf("instance exited at start:\n%s", p.Tail())
	default:
	}
	return p
}

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

// hostBinary builds protean-host once per test binary; TestMain removes it
// (removeHostBinary).
func hostBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "protean-host-bin-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "protean-host")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/protean-host")
		cmd.Dir = wasmbuild.Root()
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	require.NoError(t, binErr)
	return binPath
}

// removeHostBinary removes the directory hostBinary built into, if it did.
func removeHostBinary() {
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// twoProcesses starts two host processes over the example plugins, and a
// client of the deployment's Redis.
func (d redisDeployment) twoProcesses(t *testing.T) ([]*process, *redis.Client) {
	t.Helper()
	dir := wasmbuild.Examples(t)
	procs := []*process{d.startProcess(t, dir), d.startProcess(t, dir)}
	opt, err := redis.ParseURL(d.redisURL)
	require.NoError(t, err)
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	return procs, rdb
}

// startProcess runs protean-host run on a config written for d, with the
// TOML lines extra after it, and the environment variables env.
func (d redisDeployment) startProcess(t *testing.T, dir string, extra ...string) *process {
	t.Helper()
	addr := freeAddr(t)
	tmp := t.TempDir()
	cfg := filepath.Join(tmp, "host.toml")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf(`
[databases.default]
provider = "postgresql"
database_uri = %q
[event_store]
provider = "message_db"
database_uri = %q
[brokers.default]
provider = "redis"
uri = %q
key_prefix = %q
[server.partitioning]
lease_ttl_ms = 2000
heartbeat_interval_seconds = 0.2
poll_interval_seconds = 0.01
[plugins]
dir = %q
cache_dir = %q
cache_max_mb = 0
[http]
listen = %q
%s`, d.dbURL, d.dbURL, d.redisURL, d.prefix, dir, wasmbuild.CacheDir(t), addr, strings.Join(extra, "\n"))), 0o644))
	return startProcess(t, addr, cfg, tmp, nil, "OTEL_BSP_SCHEDULE_DELAY=50")
}

func (p *process) kill() {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-p.done
}

func (p *process) Tail() string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// orderLog places c-1's orders on host processes and waits until the
// client_orders projection shows exactly the accepted ones, in order.
type orderLog struct {
	t    *testing.T
	want []string
}

func (o *orderLog) place(p *process, order string) {
	o.t.Helper()
	r := do(o.t, "POST", "http://"+p.addr+"/v1/commands/PlaceOrder", fmt.Sprintf(`{"order_id":%q,"client_id":"c-1","total":1}`, order))
	require.Equal(o.t, 200, r.code, r.String())
	o.want = append(o.want, order)
}

func (o *orderLog) projected(p *process) {
	o.t.Helper()
	testwait.For(o.t, "c-1's orders projected exactly once, in order", func() (bool, string) {
		r, err := send("GET", "http://"+p.addr+"/v1/projections/client_orders/c-1", "")
		if err != nil {
			return false, err.Error()
		}
		return r.code == 200 && slices.Equal(stringsOf(r.body["order_ids"]), o.want), fmt.Sprintf("want %v, got %s\n%s", o.want, r, p.Tail())
	})
}

// Killing the owner of a partition (SIGKILL: no drain, no release) moves
// it to the surviving instance within the lease TTL plus a discovery pass,
// and nothing committed before the crash is applied again.
func TestRedisFailoverAfterKill(t *testing.T) {
	d := newRedisDeployment(t)
	procs, rdb := d.twoProcesses(t)

	log := &orderLog{t: t}
	for i := 0; i < 5; i++ {
		log.place(procs[i%2], fmt.Sprintf("o-%d", i))
	}
	log.projected(procs[0])

	// Find and kill the owner of c-1's client_orders partition.
	leaseKey := d.prefix + redispartition.LeaseKey("client_orders", partition.PartitionUnit("order", "c-1"))
	token, err := rdb.Get(context.Background(), leaseKey).Result()
	require.NoError(t, err)
	victim, survivor := procs[0], procs[1]
	if !strings.Contains(token, fmt.Sprintf(":%d:", procs[0].cmd.Process.Pid)) {
		victim, survivor = procs[1], procs[0]
	}
	require.Contains(t, token, fmt.Sprintf(":%d:", victim.cmd.Process.Pid), "lease %s", token)
	killed := time.Now()
	victim.kill()

	for i := 5; i < 8; i++ {
		log.place(survivor, fmt.Sprintf("o-%d", i))
	}
	log.projected(survivor)
	t.Logf("failover: killed owner %s; the survivor handled the next event of c-1 after %s (lease TTL 2s)", token, time.Since(killed).Round(time.Millisecond))
	newToken, err := rdb.Get(context.Background(), leaseKey).Result()
	require.NoError(t, err)
	require.Contains(t, newToken, fmt.Sprintf(":%d:", survivor.cmd.Process.Pid))
}

// An owner stopped past its lease TTL (SIGSTOP: a frozen VM, a long GC
// pause) is replaced; when it resumes (SIGCONT) it finds its lease lost
// and gives the partition up, and no order is reordered or applied twice.
func TestRedisStalledOwnerResumes(t *testing.T) {
	d := newRedisDeployment(t)
	procs, rdb := d.twoProcesses(t)
	log := &orderLog{t: t}
	log.place(procs[0], "o-0")
	log.projected(procs[0])
	leaseKey := d.prefix + redispartition.LeaseKey("client_orders", partition.PartitionUnit("order", "c-1"))
	token, err := rdb.Get(context.Background(), leaseKey).Result()
	require.NoError(t, err)
	owner, other := procs[0], procs[1]
	if !strings.Contains(token, fmt.Sprintf(":%d:", owner.cmd.Process.Pid)) {
		owner, other = procs[1], procs[0]
	}
	require.NoError(t, owner.cmd.Process.Signal(syscall.SIGSTOP))
	resumed := false
	defer func() {
		if !resumed {
			_ = owner.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	for i := 1; i < 4; i++ {
		log.place(other, fmt.Sprintf("o-%d", i))
	}
	stopped := time.Now()
	log.projected(other)
	t.Logf("the successor handled c-1 %s after the owner stopped (lease TTL 2s)", time.Since(stopped).Round(time.Millisecond))
	require.NoError(t, owner.cmd.Process.Signal(syscall.SIGCONT))
	resumed = true
	testwait.For(t, "the resumed owner notices its lease is lost", func() (bool, string) {
		tail := owner.Tail()
		return strings.Contains(tail, "partition lease lost"), tail
	})
	t.Logf("the resumed owner noticed after %s", time.Since(stopped).Round(time.Millisecond))
	for i := 4; i < 7; i++ {
		log.place(owner, fmt.Sprintf("o-%d", i))
	}
	log.projected(owner)
	t.Logf("the resumed instance's commands handled after %s", time.Since(stopped).Round(time.Millisecond))
	newToken, err := rdb.Get(context.Background(), leaseKey).Result()
	require.NoError(t, err)
	require.Contains(t, newToken, fmt.Sprintf(":%d:", other.cmd.Process.Pid), "the successor keeps the partition")
}
