package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/ops"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// pgInline is a migrated PostgreSQL database that host processes share
// with the inline broker and no Redis: the default delivery there is the
// event-store subscriptions.
type pgInline struct {
	dbURL string
	dir   string
	pool  *pgxpool.Pool
}

func newPGInline(t *testing.T) pgInline {
	t.Helper()
	d := pgInline{dbURL: testserver.Postgres(t), dir: wasmbuild.Examples(t)}
	d.migrate(t)
	return d
}

// migrate migrates d's database through the CLI and opens d.pool on it;
// it returns the config it wrote.
func (d *pgInline) migrate(t *testing.T) string {
	t.Helper()
	cfg := d.writeConfig(t, "127.0.0.1:0")
	code, _, errs := cli(t, "migrate", "--config", cfg)
	require.Equal(t, 0, code, errs)
	pool, err := pgxpool.New(context.Background(), d.dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	d.pool = pool
	return cfg
}

func (d pgInline) writeConfig(t *testing.T, addr string) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "host.toml")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf(`
[databases.default]
provider = "postgresql"
database_uri = %q
[event_store]
provider = "message_db"
database_uri = %q
[brokers.default]
provider = "inline"
[server.partitioning]
lease_ttl_ms = 2000
heartbeat_interval_seconds = 0.2
[server.event_store_subscription]
poll_interval_ms = 20
[plugins]
dir = %q
cache_dir = %q
cache_max_mb = 0
[http]
listen = %q
`, d.dbURL, d.dbURL, d.dir, wasmbuild.CacheDir(t), addr)), 0o644))
	return cfg
}

func (d pgInline) start(t *testing.T) *process {
	t.Helper()
	addr := freeAddr(t)
	cfg := d.writeConfig(t, addr)
	return startProcess(t, addr, cfg, t.TempDir(), nil)
}

// loader places orders for four clients on the given hosts, from
// loaderSenders goroutines per host (so that a backlog of unhandled
// events builds up), until stopped; a host that does not answer is
// dropped.
type loader struct {
	accepted atomic.Int64
	stop     chan struct{}
	wg       sync.WaitGroup
}

const loaderSenders = 6

func startLoader(hosts ...*process) *loader {
	l := &loader{stop: make(chan struct{})}
	for si := range loaderSenders * len(hosts) {
		h, hi := hosts[si%len(hosts)], si
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				id := fmt.Sprintf("o-%s-%d-%d", strings.ReplaceAll(h.addr, ":", "_"), hi, i)
				r, err := send("POST", "http://"+h.addr+"/v1/commands/PlaceOrder", fmt.Sprintf(`{"order_id":%q,"client_id":"c-%d","total":1}`, id, i%4))
				if err != nil {
					return // killed
				}
				if r.code == 200 {
					l.accepted.Add(1)
				}
			}
		}()
	}
	return l
}

func (l *loader) waitAccepted(t *testing.T, n int64) {
	t.Helper()
	testwait.For(t, fmt.Sprintf("%d orders accepted", n), func() (bool, string) {
		return l.accepted.Load() >= n, fmt.Sprint(l.accepted.Load())
	})
}

func (l *loader) halt() {
	close(l.stop)
	l.wg.Wait()
}

// exactlyOnce waits until, for every client, the client_orders projection
// (read through p) holds exactly the orders whose OrderPlaced events the
// store committed, each once, in commit order.
func (d pgInline) exactlyOnce(t *testing.T, p *process) {
	t.Helper()
	rows, err := d.pool.Query(context.Background(), `SELECT data->>'client_id', data->>'order_id' FROM message_store.messages
		WHERE type = 'OrderPlaced' ORDER BY global_position`)
	require.NoError(t, err)
	committed := map[string][]string{}
	total := 0
	for rows.Next() {
		var c, o string
		require.NoError(t, rows.Scan(&c, &o))
		committed[c] = append(committed[c], o)
		total++
	}
	require.NoError(t, rows.Err())
	require.NotZero(t, total)
	for c, want := range committed {
		testwait.For(t, "client "+c+"'s committed orders projected exactly once, in order", func() (bool, string) {
			r, err := send("GET", "http://"+p.addr+"/v1/projections/client_orders/"+c, "")
			if err != nil {
				return false, err.Error()
			}
			got := stringsOf(r.body["order_ids"])
			orders, _ := r.body["orders"].(float64)
			return r.code == 200 && slices.Equal(got, want) && int(orders) == len(want),
				fmt.Sprintf("want %d orders, got %d ids (orders=%v); first difference at %d\n%s", len(want), len(got), orders, firstDiff(got, want), p.Tail())
		})
	}
	t.Logf("%d committed orders projected exactly once", total)
	testwait.For(t, "the owner reports client_orders caught up", func() (bool, string) {
		r, err := send("GET", "http://"+p.addr+"/metrics", "")
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(r.raw, `protean_subscription_lag{group="client_orders",unit="order"} 0`) &&
			strings.Contains(r.raw, `protean_subscription_messages_total{group="client_orders",outcome="ok",unit="order"}`), "no lag 0 in /metrics"
	})
}

func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// On PostgreSQL with the inline broker, a host killed (SIGKILL: no drain)
// while orders flow loses nothing and applies nothing twice: the restarted
// host resumes every subscription after the position committed with the
// last applied event's effects.
func TestEventStoreSubscriptionSurvivesKill(t *testing.T) {
	d := newPGInline(t)
	p := d.start(t)
	l := startLoader(p)
	l.waitAccepted(t, 40)
	p.kill()
	l.halt()
	p2 := d.start(t)
	l2 := startLoader(p2)
	l2.waitAccepted(t, 10)
	l2.halt()
	d.exactlyOnce(t, p2)
	var pub, pending int
	require.NoError(t, d.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE status = 'published'), count(*) FILTER (WHERE status <> 'published') FROM outbox`).Scan(&pub, &pending))
	t.Logf("outbox: %d published, %d not yet", pub, pending)
	testSubscriptionsCommands(t, d)
}

// The operator commands: list shows each subscription's position, lease
// and lag; failed, retry and skip act on the failure records.
func testSubscriptionsCommands(t *testing.T, d pgInline) {
	cfg := d.writeConfig(t, "127.0.0.1:0")
	code, out, errs := cli(t, "subscriptions", "list", "--config", cfg)
	require.Equal(t, 0, code, errs)
	require.Regexp(t, `(?m)^client_orders\s+order\s+(\d+)\s+(\d+)\s+0\s+\d+\s+\S+:\d+:[0-9a-f]{12}\s+expires in`, out, "caught up and leased")
	failures := subscription.NewPostgresFailures(d.pool)
	require.NoError(t, failures.Record(context.Background(), subscription.Failure{Group: "client_orders", Unit: "order", GlobalPosition: 1,
		MessageID: "m", Stream: "order-x", Type: "OrderPlaced", Key: "c-9", Status: subscription.StatusFailed, Attempts: 4, Error: "boom"}))
	code, out, errs = cli(t, "subscriptions", "failed", "--config", cfg)
	require.Equal(t, 0, code, errs)
	require.Regexp(t, `(?m)^client_orders\s+order\s+1\s+failed\s+c-9\s+OrderPlaced\s+order-x\s+4\s+\S+\s+boom$`, out)
	// -o json: what the host's /v1/ops answers, for scripts.
	code, out, errs = cli(t, "subscriptions", "failed", "-o", "json", "--config", cfg)
	require.Equal(t, 0, code, errs)
	var recs []ops.Failure
	require.NoError(t, json.Unmarshal([]byte(out), &recs), out)
	require.Len(t, recs, 1)
	require.Equal(t, "boom", recs[0].Error)
	require.Equal(t, int64(1), recs[0].Position)
	code, out, errs = cli(t, "subscriptions", "list", "-o", "json", "--config", cfg)
	require.Equal(t, 0, code, errs)
	var subs []ops.Subscription
	require.NoError(t, json.Unmarshal([]byte(out), &subs), out)
	require.NotEmpty(t, subs)
	code, _, errs = cli(t, "subscriptions", "skip", "client_orders", "order", "1", "--config", cfg)
	require.Equal(t, 0, code, errs)
	code, _, errs = cli(t, "subscriptions", "retry", "client_orders", "order", "1", "--config", cfg)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "is skipped: cannot retry")
	code, out, errs = cli(t, "subscriptions", "failed", "--config", cfg)
	require.Equal(t, 0, code, errs)
	require.NotContains(t, out, "boom", "a skipped record is not open")
	code, out, _ = cli(t, "subscriptions", "failed", "--all", "--config", cfg)
	require.Equal(t, 0, code)
	require.Contains(t, out, "skipped")
}

// Two hosts on one database: the lease holder of client_orders is killed
// while both take orders; the survivor takes the subscription over within
// the lease TTL and every committed order is applied exactly once.
func TestEventStoreSubscriptionFailoverAfterKill(t *testing.T) {
	d := newPGInline(t)
	a, b := d.start(t), d.start(t)
	l := startLoader(a, b)
	l.waitAccepted(t, 30)
	var owner string
	testwait.For(t, "a lease holder for client_orders", func() (bool, string) {
		err := d.pool.QueryRow(context.Background(), `SELECT owner FROM subscription_leases WHERE consumer_group = 'client_orders' AND unit = 'order'`).Scan(&owner)
		return err == nil, fmt.Sprint(err)
	})
	victim, survivor := a, b
	if !strings.Contains(owner, fmt.Sprintf(":%d:", a.cmd.Process.Pid)) {
		victim, survivor = b, a
	}
	require.Contains(t, owner, fmt.Sprintf(":%d:", victim.cmd.Process.Pid))
	killed := time.Now()
	victim.kill()
	before := l.accepted.Load()
	l.waitAccepted(t, before+20) // the survivor keeps taking orders
	l.halt()
	d.exactlyOnce(t, survivor)
	t.Logf("killed the owner %s; all committed orders applied %s later (lease TTL 2s)", owner, time.Since(killed).Round(time.Millisecond))
	testwait.For(t, "the survivor holds the lease", func() (bool, string) {
		err := d.pool.QueryRow(context.Background(), `SELECT owner FROM subscription_leases WHERE consumer_group = 'client_orders' AND unit = 'order'`).Scan(&owner)
		return err == nil && strings.Contains(owner, fmt.Sprintf(":%d:", survivor.cmd.Process.Pid)), owner
	})
	// The process manager's two categories, each its own subscription.
	require.Equal(t, 200, do(t, "POST", "http://"+survivor.addr+"/v1/commands/ShipOrder", `{"shipment_id":"s-1","order_id":"o-x"}`).code)
	require.Equal(t, 200, do(t, "POST", "http://"+survivor.addr+"/v1/commands/RecordPayment", `{"payment_id":"p-1","order_id":"o-x","amount":1}`).code)
	testwait.For(t, "the order fulfilled", func() (bool, string) {
		r, err := send("GET", "http://"+survivor.addr+"/v1/projections/fulfillment/o-x", "")
		return err == nil && r.code == 200 && r.body["status"] == "fulfilled", fmt.Sprint(r, err)
	})
}
