package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// TestReadFloodsAreBounded runs the real host on PostgreSQL with a
// tenant's stream of 270 MB (1,080 events of 256 KiB), and the tenant's
// handler reading it from the start, again and again, in two deliveries.
// Before read_stream was bounded, one read
// was 1,000 events (256 MB) built on the host's heap, uncounted, and two
// such calls took the host from 1.7 to 4.4 GB and ran 115 s past a 5 s
// deadline. Now each page holds 1 MiB, the call ends at max_host_bytes
// or its deadline with an error naming the module and the limit, the
// other tenant's commands keep answering, and the host's peak resident
// memory stays within the bound TestHostileTenantIsContained states: the
// configured per-instance budgets plus a fixed overhead.
func TestReadFloodsAreBounded(t *testing.T) {
	url := testserver.Postgres(t)
	examples := wasmbuild.Examples(t)
	dir := t.TempDir()
	wasmbuild.Copy(t, filepath.Join(examples, "orders.wasm"), dir, "orders.wasm")
	wasmbuild.Copy(t, wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"), dir, "behave.wasm")
	const (
		memoryMB  = 32
		outputMB  = 1
		instances = 2 // GOMAXPROCS of the child is capped below
		modules   = 2
		overhead  = 384 << 20
		events    = 1080
		size      = 256 << 10
	)
	body := fmt.Sprintf(`
[databases.default]
provider = "postgresql"
database_uri = %q
[event_store]
provider = "message_db"
database_uri = %q
[plugins]
dir = %q
cache_dir = %q
cache_max_mb = 0
[plugins.limits]
timeout_ms = 3000
memory_mb = %d
max_output_bytes = %d
[server.stream_subscription]
max_retries = 1
retry_delay_seconds = 0.05
[tenants.shop]
modules = ["orders"]
[tenants.evil]
modules = ["behave"]
`, url, url, dir, wasmbuild.CacheDir(t), memoryMB, outputMB<<20)
	cfg := filepath.Join(t.TempDir(), "migrate.toml")
	require.NoError(t, os.WriteFile(cfg, []byte(body), 0o644))
	code, _, errs := cli(t, "migrate", "--config", cfg)
	require.Equal(t, 0, code, errs)

	// The tenant's stream, written straight into the store: the guest
	// would need 360 commands at its output limit to write it.
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(context.Background(), `INSERT INTO message_store.messages (stream_name, type, position, data)
		SELECT 'pad-1', 'Padded', g, jsonb_build_object('pad', repeat('x', $1::int)) FROM generate_series(0, $2::int - 1) g`, size, events)
	require.NoError(t, err)

	p := runHostEnv(t, body, "5s", "GOMAXPROCS=2")
	base := "http://" + p.addr
	metric := func(outcome string) (n int) {
		r, err := send("GET", base+"/metrics", "")
		require.NoError(t, err)
		for _, l := range strings.Split(r.raw, "\n") {
			if strings.HasPrefix(l, "protean_handler_calls_total{") && strings.Contains(l, `handler="behave"`) &&
				strings.Contains(l, `outcome="`+outcome+`"`) {
				var v float64
				_, err := fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &v)
				require.NoError(t, err)
				n += int(v)
			}
		}
		return n
	}

	// The shop's traffic, all along: every command must answer 200, once
	// its module's code has compiled (a first command while it compiles
	// may answer 503 on a loaded machine, as a client is told to retry).
	sendReady(t, base+"/v1/commands/PlaceOrder", `{"order_id":"o-warm","client_id":"c-1","total":1}`)
	shop := startShopTraffic(base)

	for _, id := range []string{"a", "b"} {
		sendReady(t, base+"/v1/commands/EmitOp", fmt.Sprintf(`{"op":"read_flood","id":%q,"arg":"pad-1"}`, id))
	}
	// Two floods; each call ends at its byte budget or, on a slow
	// machine, its deadline, and fails its message as its own (a
	// permanent failure: recorded for an operator, not retried).
	testwait.For(t, "every read flood stopped", func() (bool, string) {
		limited, timedOut := metric("host_limit"), metric("timeout")
		return limited+timedOut >= 2, fmt.Sprintf("%d ended at a budget, %d at the deadline\n%s", limited, timedOut, p.Tail())
	})
	// The metric counts a call as it ends; the message's failure is logged
	// once the subscription has recorded it, a moment later: wait for both
	// records, then check what each says.
	var failed []string
	testwait.For(t, "both floods recorded as failed", func() (bool, string) {
		full, err := os.ReadFile(p.log)
		require.NoError(t, err)
		failed = failed[:0]
		for _, l := range strings.Split(string(full), "\n") {
			if strings.Contains(l, "failed past its retries") && strings.Contains(l, "handler behave") {
				failed = append(failed, l)
			}
		}
		return len(failed) >= 2, p.Tail()
	})
	for _, l := range failed {
		switch {
		case strings.Contains(l, "behave.wasm: handler behave: host-function budget exceeded: read_stream:"):
			require.Contains(t, l, "(limit max_host_bytes = 67108864)")
		case strings.Contains(l, "call exceeded its deadline"): // a slow machine's
		default:
			t.Fatalf("a read flood failed for another reason: %s", l)
		}
	}

	before := shop.count()
	testwait.For(t, "the shop's commands to keep answering", func() (bool, string) {
		n := shop.count()
		return n > before+10, fmt.Sprintf("%d placed", n)
	})
	require.Empty(t, shop.stop(), "the shop's commands answered 200 throughout")

	peak := peakRSS(t, p.cmd.Process.Pid)
	bound := int64(modules*instances*(memoryMB<<20+2*outputMB<<20) + overhead)
	t.Logf("host peak RSS %d MiB, bound %d MiB (a stream of %d MiB read by two floods)", peak>>20, bound>>20, events*size>>20)
	require.Less(t, peak, bound, "peak RSS within the configured per-instance bounds plus overhead")
}

// shopTraffic places orders for tenant shop, one after another, until
// stopped, counting the answers 200 and keeping the others.
type shopTraffic struct {
	mu      sync.Mutex
	placed  int
	refused []string
	halt    chan struct{}
	ended   chan struct{}
}

// postReady POSTs body to url until it is not answered 503 for a module
// whose code is still compiling (on a loaded machine a compile can outlast
// a first call's deadline; the client is told to retry), and returns the
// answer.
func postReady(t *testing.T, url, body string) reply {
	t.Helper()
	var r reply
	testwait.For(t, "POST "+url+" past its module's compile", func() (bool, string) {
		var err error
		r, err = send("POST", url, body)
		require.NoError(t, err)
		return !(r.code == http.StatusServiceUnavailable && strings.Contains(r.raw, "module not ready")), r.String()
	})
	return r
}

// sendReady is postReady, requiring a 200.
func sendReady(t *testing.T, url, body string) {
	t.Helper()
	r := postReady(t, url, body)
	require.Equal(t, 200, r.code, r.String())
}

func startShopTraffic(base string) *shopTraffic {
	s := &shopTraffic{halt: make(chan struct{}), ended: make(chan struct{})}
	go func() {
		defer close(s.ended)
		for i := 0; ; i++ {
			select {
			case <-s.halt:
				return
			default:
			}
			r, err := send("POST", base+"/v1/commands/PlaceOrder", fmt.Sprintf(`{"order_id":"o-%d","client_id":"c-1","total":1}`, i))
			s.mu.Lock()
			if err != nil || r.code != 200 {
				s.refused = append(s.refused, fmt.Sprintf("%v %v", r, err))
			} else {
				s.placed++
			}
			s.mu.Unlock()
		}
	}()
	return s
}

// count is how many orders were placed so far.
func (s *shopTraffic) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.placed
}

// stop ends the traffic and returns what was not answered 200.
func (s *shopTraffic) stop() []string {
	close(s.halt)
	<-s.ended
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused
}

// peakRSS is the peak resident memory of process pid so far (VmHWM), in
// bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			var kb int64
			_, err := fmt.Sscanf(strings.TrimPrefix(l, "VmHWM:"), "%d", &kb)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}
