package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/pprof"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/chaos"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// The table gives each row's maximum as a ratio of the floor's, the first
// row.
func TestTableRatiosAgainstTheFloor(t *testing.T) {
	rows := []Row{
		{Name: "floor", MaxRate: 400, HalfRate: 200, P50: 2 * time.Millisecond, P99: 9 * time.Millisecond, CmdP50: time.Millisecond, CmdP99: 3 * time.Millisecond},
		{Name: "1 host(s)", MaxRate: 100, HalfRate: 50, P50: 5 * time.Millisecond, P99: 40 * time.Millisecond, Misses: 2, CmdP50: 4 * time.Millisecond, CmdP99: 30 * time.Millisecond},
	}
	got := Table(rows)
	require.Contains(t, got, "| floor | 400 | 1.00× | 1ms / 3ms | 200 | 2ms / 9ms | 0 |")
	require.Contains(t, got, "| 1 host(s) | 100 | 0.25× | 4ms / 30ms | 50 | 5ms / 40ms | 2 |")
}

// Over several rounds the table gives each configuration's medians, its
// ratio to the floor taken within each round (not median over median),
// and the range of those ratios.
func TestTableMediansOverRounds(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	var rows []Row
	for r, v := range []struct {
		floor, host float64
		p99         int
	}{{1000, 300, 40}, {2000, 500, 20}, {1000, 350, 90}} {
		rows = append(rows,
			Row{Name: "floor", Round: r, MaxRate: v.floor, HalfRate: v.floor / 2, P50: ms(1), P99: ms(5), CmdP50: ms(2), CmdP99: ms(9)},
			Row{Name: "1 host(s)", Round: r, MaxRate: v.host, HalfRate: v.host / 2, P50: ms(4), P99: ms(v.p99), Misses: 1, CmdP50: ms(8), CmdP99: ms(30)})
		if r == 0 {
			rows = append(rows, Row{Name: "floor+lock", Round: r, MaxRate: 600})
		}
	}
	got := Table(rows)
	require.Contains(t, got, "Medians over 3 rounds")
	require.Contains(t, got, "| floor | 3 | 1000 | 1.00× (1.00–1.00) | 2ms / 9ms | 500 | 1ms / 5ms | 0 |")
	// Ratios 0.30, 0.25, 0.35: median 0.30, while the median rate over
	// the median floor would be 350 / 1000.
	require.Contains(t, got, "| 1 host(s) | 3 | 350 | 0.30× (0.25–0.35) | 8ms / 30ms | 175 | 4ms / 40ms | 3 |")
	require.Contains(t, got, "| floor+lock | 1 | 600 | 0.60× (0.60–0.60) |")
}

// Every second round measures the host configurations in reverse order.
func TestRoundOrderAlternates(t *testing.T) {
	g := []string{"a", "b", "c"}
	require.Equal(t, []string{"a", "b", "c"}, roundOrder(g, 0))
	require.Equal(t, []string{"c", "b", "a"}, roundOrder(g, 1))
	require.Equal(t, []string{"a", "b", "c"}, roundOrder(g, 2))
	require.Equal(t, []string{"a", "b", "c"}, g, "the caller's order is left alone")
}

// The run's own hosts come first, then each setting, each binary and each
// plugins directory, each comparison on CompareHosts hosts; a binary that
// is not there, or a plugins directory without a module, is refused
// before anything runs.
func TestHostGroups(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "protean-host-old")
	require.NoError(t, os.WriteFile(bin, nil, 0o755))
	base, c := t.TempDir(), filepath.Join(t.TempDir(), "plugins-c")
	require.NoError(t, os.Mkdir(c, 0o755))
	for dir, files := range map[string][]string{base: {"orders.wasm", "client_orders.wasm", "shipping.wasm"}, c: {"orders.wasm", "client_orders.wasm"}} {
		for _, f := range files {
			require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte(dir+"/"+f), 0o644))
		}
	}
	run := t.TempDir()
	o := Options{Bin: "build/protean-host", Plugins: base, Hosts: []int{1, 3}, Compare: []string{"plugins.document_cache_mb=0"},
		CompareBins: []string{bin}, ComparePlugins: []string{c}, CompareHosts: 3}
	groups, err := hostGroups(o, chaos.HostConfig{}, run)
	require.NoError(t, err)
	require.Len(t, groups, 4)
	require.Equal(t, "", groups[0].label)
	require.Equal(t, []int{1, 3}, groups[0].o.Hosts)
	require.Equal(t, " [plugins.document_cache_mb=0]", groups[1].label)
	require.Equal(t, map[string]any{"plugins.document_cache_mb": int64(0)}, groups[1].cfg.Settings)
	require.Equal(t, []int{3}, groups[1].o.Hosts)
	require.Equal(t, " [protean-host-old]", groups[2].label)
	require.Equal(t, bin, groups[2].o.Bin)
	require.Equal(t, "build/protean-host", groups[1].o.Bin)
	require.Nil(t, groups[2].cfg.Settings)
	require.Equal(t, base, groups[2].o.Plugins)
	// The C modules in place of their namesakes, the rest kept.
	require.Equal(t, " [plugins-c]", groups[3].label)
	require.Equal(t, []int{3}, groups[3].o.Hosts)
	for f, from := range map[string]string{"orders.wasm": c, "client_orders.wasm": c, "shipping.wasm": base} {
		b, err := os.ReadFile(filepath.Join(groups[3].o.Plugins, f))
		require.NoError(t, err)
		require.Equal(t, from+"/"+f, string(b))
	}

	missing := o
	missing.CompareBins = []string{filepath.Join(t.TempDir(), "missing")}
	_, err = hostGroups(missing, chaos.HostConfig{}, t.TempDir())
	require.ErrorContains(t, err, "-compare-bin")
	empty := o
	empty.ComparePlugins = []string{t.TempDir()}
	_, err = hostGroups(empty, chaos.HostConfig{}, t.TempDir())
	require.ErrorContains(t, err, "holds no module")
}

// parseProcStat counts the fields from comm's last ')', so a comm with
// spaces and parentheses does not shift utime and stime.
func TestParseProcStat(t *testing.T) {
	t.Parallel()
	st, err := parseProcStat("4242 (a (b) c) S 7 4242 4242 0 -1 4194560 100 0 0 0 310 42 5 3 20 0 9 0 1234 0 0")
	require.NoError(t, err)
	require.Equal(t, procStat{ppid: 7, comm: "a (b) c", ticks: 352, childTicks: 8}, st)

	for _, bad := range []string{"", "4242 no comm S 1", "4242 (x) S 7 1 1", "4242 (x) S 7 1 1 0 -1 0 0 0 0 0 ten 42 5 3"} {
		_, err := parseProcStat(bad)
		require.Error(t, err, bad)
	}
}

// A tree's CPU is every live member's own and reaped time; a backend
// that ends moves into its parent's reaped time, so the difference
// between two readings counts it once.
func TestTreeTicksCountsAnEndedChildOnce(t *testing.T) {
	t.Parallel()
	before := map[int]procStat{
		1:  {ppid: 0, ticks: 1000},
		10: {ppid: 1, ticks: 50, childTicks: 4}, // the postmaster
		11: {ppid: 10, ticks: 30},               // a backend that will end
		12: {ppid: 10, ticks: 20},
		20: {ppid: 1, ticks: 500}, // not in the tree
	}
	after := map[int]procStat{
		1:  {ppid: 0, ticks: 1100},
		10: {ppid: 1, ticks: 60, childTicks: 4 + 45}, // reaped 11, at 45
		12: {ppid: 10, ticks: 70},
		13: {ppid: 10, ticks: 5}, // a new backend
		20: {ppid: 1, ticks: 900},
	}
	t0, ok := treeTicks(before, 10, true)
	require.True(t, ok)
	require.EqualValues(t, 50+4+30+20, t0)
	t1, ok := treeTicks(after, 10, true)
	require.True(t, ok)
	require.EqualValues(t, (60-50)+(45-30)+(70-20)+5, t1-t0)

	own, ok := treeTicks(after, 10, false)
	require.True(t, ok)
	require.EqualValues(t, 60, own)
	_, ok = treeTicks(after, 11, true)
	require.False(t, ok, "an ended process")
	require.Equal(t, 1500*time.Millisecond, ticksDuration(150))
}

// The machine's busy time leaves out idle and iowait, and guest time
// (already in user).
func TestMachineTicks(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "stat")
	require.NoError(t, os.WriteFile(path, []byte("cpu  100 2 30 900 7 1 4 0 50 0\ncpu0 50 1 15 450 3 0 2 0 25 0\n"), 0o644))
	busy, ok := machineTicks(path)
	require.True(t, ok)
	require.EqualValues(t, 100+2+30+1+4, busy)
	require.NoError(t, os.WriteFile(path, []byte("intr 1 2 3\n"), 0o644))
	_, ok = machineTicks(path)
	require.False(t, ok)
}

const goroutineDump = `goroutine profile: total 71
3 @ 0x4a1 0x4a2 0x4a3
#	0x4a1	runtime.gopark+0xce				/go/src/runtime/proc.go:435
#	0x4a2	github.com/x/outbox.(*Relay).loop+0x1f5	/src/outbox/relay.go:120
#	0x4a3	runtime.goexit+0x1				/go/src/runtime/asm_amd64.s:1700

64 @ 0x4b1 0x4b2 0x4b3 0x4b4
# labels: {"handler":"orders"}
#	0x4b1	internal/poll.runtime_pollWait+0x85	/go/src/runtime/netpoll.go:351
#	0x4b2	internal/poll.(*pollDesc).wait+0x26	/go/src/internal/poll/fd_poll_runtime.go:84
#	0x4b3	net/http.(*conn).serve+0x65a		/go/src/net/http/server.go:2102
#	0x4b4	runtime.goexit+0x1			/go/src/runtime/asm_amd64.s:1700

4 @ 0x4c1
#	0x4c1	runtime.gopark+0xce	/go/src/runtime/proc.go:435

`

// The dump's stacks come out the most goroutines first, each named by
// where it waits (outside runtime) and the goroutine's own function.
func TestParseGoroutinesTopStacks(t *testing.T) {
	t.Parallel()
	total, stacks, err := parseGoroutines(goroutineDump)
	require.NoError(t, err)
	require.Equal(t, 71, total)
	require.Len(t, stacks, 3)
	require.Equal(t, []int{64, 4, 3}, []int{stacks[0].count, stacks[1].count, stacks[2].count})
	require.Equal(t, []string{"internal/poll.runtime_pollWait", "internal/poll.(*pollDesc).wait", "net/http.(*conn).serve", "runtime.goexit"}, stacks[0].frames)

	for i, want := range [][2]string{
		{"internal/poll.runtime_pollWait", "net/http.(*conn).serve"},
		{"runtime.gopark", "runtime.gopark"}, // runtime only
		{"github.com/x/outbox.(*Relay).loop", "github.com/x/outbox.(*Relay).loop"},
	} {
		wait, owner := stacks[i].waitAndOwner()
		require.Equal(t, want, [2]string{wait, owner}, i)
	}

	_, _, err = parseGoroutines("3 @ 0x1\n")
	require.Error(t, err, "no total line")
	_, _, err = parseGoroutines("goroutine profile: total 1\nx3 @ 0x1\n")
	require.Error(t, err)

	path := filepath.Join(t.TempDir(), "g.txt")
	require.NoError(t, os.WriteFile(path, []byte(goroutineDump), 0o644))
	lines, err := goroutineSummary(path)
	require.NoError(t, err)
	require.Equal(t, []string{
		"71 goroutines in 3 stacks; the 3 largest (count, where it waits, whose goroutine):",
		"   64  internal/poll.runtime_pollWait  in net/http.(*conn).serve",
		"    4  runtime.gopark  in runtime.gopark",
		"    3  github.com/x/outbox.(*Relay).loop  in github.com/x/outbox.(*Relay).loop",
	}, lines)
}

// Of go tool pprof -top's output the summary keeps the duration and
// total, what the nodes shown account for, and the table.
func TestTopTableKeepsTheTable(t *testing.T) {
	t.Parallel()
	out := `File: protean-host
Build ID: abc
Type: cpu
Time: 2026-12-06 10:00:00 UTC
Duration: 5s, Total samples = 3.20s (64.00%)
Showing nodes accounting for 1.50s, 46.88% of 3.20s total
Dropped 200 nodes (cum <= 0.02s)
Showing top 8 nodes out of 400
      flat  flat%   sum%        cum   cum%
     0.50s 15.62% 15.62%      0.50s 15.62%  runtime/internal/syscall.Syscall6
     0.40s 12.50% 28.12%      0.90s 28.12%  github.com/tetratelabs/wazero.(*callEngine).call
`
	require.Equal(t, []string{
		"Duration: 5s, Total samples = 3.20s (64.00%)",
		"Showing nodes accounting for 1.50s, 46.88% of 3.20s total",
		"      flat  flat%   sum%        cum   cum%",
		"     0.50s 15.62% 15.62%      0.50s 15.62%  runtime/internal/syscall.Syscall6",
		"     0.40s 12.50% 28.12%      0.90s 28.12%  github.com/tetratelabs/wazero.(*callEngine).call",
	}, topTable(out))
}

func TestConfigSlug(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"1 host(s)": "1hosts", "3 host(s)": "3hosts", "floor": "floor", "floor+lock": "floor-lock",
		"1 host(s) [plugins.document_cache_mb=0]": "1hosts-plugins.document_cache_mb-0"} {
		require.Equal(t, want, configSlug(in))
	}
}

// Over a phase the profiler fetches a host's CPU, block, mutex and
// allocation profiles and a goroutine dump from its /debug/pprof/, accounts this
// process's CPU, and summarises them with go tool pprof.
func TestProfilerSavesAHostsProfiles(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	var scrapes atomic.Int64 // the phase's calls: 0 at its start, 3 at its end
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "# TYPE protean_handler_calls_total counter\nprotean_handler_calls_total %d\n", scrapes.Add(1)*3-3)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	dir := t.TempDir()
	p, err := newProfiler(dir, t.TempDir())
	require.NoError(t, err)
	ctx := context.Background()
	done := p.watch(ctx, "1 host(s)", []*chaos.Host{{Index: 0, Addr: strings.TrimPrefix(srv.URL, "http://")}}, 2*time.Second)
	busy := time.Now().Add(2 * time.Second) // the phase: something for the CPU profile to see
	for n := 0; time.Now().Before(busy); n++ {
		_ = fmt.Sprint(n)
	}
	done(0)

	require.Len(t, p.records, 1)
	r := p.records[0]
	require.Empty(t, r.errs)
	require.Len(t, r.files, 7)
	for _, kind := range []string{"cpu.pb.gz", "block.pb.gz", "mutex.pb.gz", "allocs.pb.gz", "goroutines.txt", "metrics-start.txt", "metrics-end.txt"} {
		fi, err := os.Stat(filepath.Join(dir, "1hosts-host0-"+kind))
		require.NoError(t, err, kind)
		require.Positive(t, fi.Size(), kind)
	}
	byName := map[string]time.Duration{}
	for _, c := range r.cpu {
		byName[c.name] = c.used
	}
	require.Equal(t, time.Duration(-1), byName["host0"], "no child process runs the host's config")
	require.Positive(t, byName["loadgen"], "this process spun for the phase")

	sum := p.summary(ctx)
	require.Contains(t, sum, "## 1 host(s), maximum phase")
	require.Contains(t, sum, "host0 goroutines (1hosts-host0-goroutines.txt):")
	require.Contains(t, sum, "host0 metrics-end (1hosts-host0-metrics-end.txt):\n  counters that moved over the phase (growth, sample):\n               3  protean_handler_calls_total\n")
	require.NotContains(t, sum, "host0 metrics-start")
	if _, err := exec.LookPath("go"); err == nil {
		require.Contains(t, sum, "host0 cpu (1hosts-host0-cpu.pb.gz):\n  Duration: ")
		require.Contains(t, sum, "flat%")
		require.Contains(t, sum, "host0 allocs (1hosts-host0-allocs.pb.gz):\n")
	}
}

// On a real PostgreSQL started with pg_stat_statements, a phase's
// statements are counted from its reset: a statement run 10 times over
// 5 orders reads 10 calls, 2 per order, and the reader's own statements
// are left out, and its plans are counted.
func TestStatementsCountAPhase(t *testing.T) {
	settings, ok := statementsSettings()
	if !ok {
		t.Skip("pg_stat_statements and auto_explain are not installed beside PostgreSQL")
	}
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "loadgen-statements-") // not t.TempDir: its parent is closed to postgres
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	require.NoError(t, os.Chmod(dir, 0o755)) // PostgreSQL runs as postgres under root
	pg, err := chaos.StartPostgres(ctx, dir, settings...)
	require.NoError(t, err)
	defer pg.Stop(false)
	st, err := openStatements(ctx, chaos.URL(pg.Addr()))
	require.NoError(t, err)
	defer st.close()

	conn, err := pgx.Connect(ctx, chaos.URL(pg.Addr()))
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE TABLE before_the_phase (n int)")
	require.NoError(t, err)
	require.NoError(t, st.reset(ctx))
	for i := range 10 {
		_, err := conn.Exec(ctx, "INSERT INTO before_the_phase VALUES ($1)", i)
		require.NoError(t, err)
	}
	total, top, err := st.read(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 10, total.calls, "only the inserts: the reset and the reads are the reader's")
	require.Len(t, top, 1)
	require.EqualValues(t, 10, top[0].calls)
	require.EqualValues(t, 10, top[0].rows)
	require.Contains(t, top[0].query, "INSERT INTO before_the_phase")
	lines := statementLines(total, top, 5)
	require.Contains(t, lines[0], "10 calls (2.00 per order)")
	// A prepared statement is planned for its first five runs, then once
	// more for its generic plan, which the other runs keep.
	require.EqualValues(t, 6, top[0].plans, "plans of the insert")
	require.Contains(t, lines[0], "6 plans")
	require.Regexp(t, `^\s+10\s+2\.00\s+6\s+100\.0%`, lines[2])

	// A statement slower than slowPlanMS leaves its plan in the log.
	_, err = conn.Exec(ctx, fmt.Sprintf("SELECT pg_sleep(%g) AS slow_enough", 1.5*slowPlanMS/1000))
	require.NoError(t, err)
	testwait.True(t, "the slow statement's plan is in the server's log", func() bool {
		b, _ := os.ReadFile(pg.Log())
		return strings.Contains(string(b), "Query Text: SELECT pg_sleep") && strings.Contains(string(b), "Result")
	})
}

// The summary gives each process's CPU per order of the phase, the
// machine's too; a phase without orders gives none.
func TestSummaryCPUPerOrder(t *testing.T) {
	t.Parallel()
	p := &profiler{records: []phaseRecord{
		{config: "1 host(s)", wall: 10 * time.Second, machine: 4 * time.Second, orders: 1000,
			cpu: []procCPU{{"host0", 2 * time.Second}, {"postgres", 500 * time.Millisecond}}},
		{config: "floor", wall: 10 * time.Second, machine: -1, cpu: []procCPU{{"postgres", time.Second}}},
	}}
	sum := p.summary(context.Background())
	require.Contains(t, sum, "  host0       2.00s  0.20 cores  2.000 ms per order\n")
	require.Contains(t, sum, "  postgres    0.50s  0.05 cores  0.500 ms per order\n")
	require.Contains(t, sum, "  machine     4.00s  0.40 cores  4.000 ms per order (every process")
	require.Contains(t, sum, "  postgres    1.00s  0.10 cores\n", "no orders: no figure per order")
}

// The publishes are read from the outbox rows committed in the half-load
// phase and published, by their events' global positions. Rows outside
// the phase, not published, or without a position do not count.
func TestPublishedAt(t *testing.T) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "loadgen-relay-") // not t.TempDir: its parent is closed to postgres
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	require.NoError(t, os.Chmod(dir, 0o755)) // PostgreSQL runs as postgres under root
	pg, err := chaos.StartPostgres(ctx, dir)
	require.NoError(t, err)
	defer pg.Stop(false)
	pool, err := pgxpool.New(ctx, chaos.URL(pg.Addr()))
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(ctx, `CREATE TABLE outbox (status text, metadata jsonb, created_at timestamptz, published_at timestamptz)`)
	require.NoError(t, err)
	from := time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)
	to := from.Add(20 * time.Second)
	add := func(status string, gp any, at time.Time) {
		md, _ := json.Marshal(map[string]any{"global_position": gp})
		_, err := pool.Exec(ctx, `INSERT INTO outbox VALUES ($1, $2, $3, $4)`, status, string(md), at, at.Add(time.Millisecond))
		require.NoError(t, err)
	}
	add("published", 7, from.Add(time.Second))
	add("published", 8, from.Add(-time.Second)) // before the phase
	add("published", 9, to)                     // after it
	add("pending", 10, from.Add(time.Second))   // not published
	add("published", "x", from.Add(time.Second))
	got, err := publishedAt(ctx, pool, from, to)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.True(t, from.Add(time.Second+time.Millisecond).Equal(got[7]), "%v", got[7])
}

// Each order's accepted → projection splits at its event's publish; the
// slowest 1 % say which part the tail is.
func TestSplitAtPublish(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	row := Row{Name: "1 host(s)"}
	published := map[int64]time.Time{}
	for i := range 200 {
		gp := int64(i + 1)
		accepted := t0.Add(time.Duration(i) * 10 * ms)
		pub, read := 2*ms, 3*ms // the usual order: 5 ms
		if i%70 == 0 {
			pub, read = 40*ms, 10*ms // three slow ones, slow at the relay
		}
		newKey := i%50 == 25 // four new keys' first orders, the last one the slowest order
		if i == 175 {
			pub, read = 40*ms, 60*ms
		}
		published[gp] = accepted.Add(pub)
		row.halfOrders = append(row.halfOrders, placedOrder{gp: gp, accepted: accepted, read: accepted.Add(pub + read), newKey: newKey})
	}
	row.halfOrders = append(row.halfOrders, placedOrder{gp: 999, accepted: t0, read: t0.Add(time.Second)}) // no publish found
	row.splitAtPublish(published)
	require.Equal(t, 200, row.Split)
	require.Equal(t, 2*ms, row.PubP50)
	require.Equal(t, 3*ms, row.ReadP50)
	require.Equal(t, 40*ms, row.PubP99)
	require.Equal(t, 10*ms, row.ReadP99)
	require.Equal(t, 40*ms, row.TailPub)
	require.Equal(t, 10*ms, row.TailRead)
	require.Equal(t, 4, row.NewKeys)
	require.Equal(t, 5*ms, row.NewKeyP99, "the p99 of four is the third: 5, 5, 5, 100 ms")
	require.Equal(t, 50*ms, row.OldKeyP99, "orders 0, 70 and 140 took 50 ms")
	require.Equal(t, 1, row.TailNewKeys, "the slowest 1 %: order 175 and one of 0, 70, 140")
	require.Contains(t, row.String(), "split at the publish (200 orders): accepted → published p50 2ms p99 40ms, published → read p50 3ms p99 10ms; the slowest 1%: published 40ms after accepted, read 10ms after that (medians); a new key's first order (4): p99 5ms, the others p99 50ms; 1 of the slowest 1% were new keys' first")
	require.NotContains(t, Row{Name: "floor"}.String(), "split", "the floor has no outbox")
}

// The profile keeps the half-load orders in time, for the tail, and a
// host's log.
func TestProfilerKeepsTheOrdersAndALog(t *testing.T) {
	dir := t.TempDir()
	p := &profiler{dir: dir}
	t0 := time.Unix(1_800_000_000, 0)
	row := Row{Name: "1 host(s)", halfOrders: []placedOrder{
		{gp: 7, accepted: t0, read: t0.Add(5 * time.Millisecond), newKey: true},
		{gp: 9, accepted: t0.Add(time.Millisecond), read: t0.Add(40 * time.Millisecond)},
	}}
	row.splitAtPublish(map[int64]time.Time{7: t0.Add(2 * time.Millisecond)})
	var notes []string
	note := func(f string, a ...any) { notes = append(notes, fmt.Sprintf(f, a...)) }
	p.keepOrders(row, note)
	b, err := os.ReadFile(filepath.Join(dir, "1hosts-orders.csv"))
	require.NoError(t, err)
	require.Equal(t, "accepted_ns,published_ns,read_ns,global_position,new_key\n"+
		"1800000000000000000,1800000000002000000,1800000000005000000,7,true\n"+
		"1800000000001000000,0,1800000000040000000,9,false\n", string(b))

	log := filepath.Join(t.TempDir(), "host.log")
	require.NoError(t, os.WriteFile(log, []byte("gc 1 @0.5s\n"), 0o644))
	p.keepLog("hosts-host0.log", log, note)
	b, err = os.ReadFile(filepath.Join(dir, "hosts-host0.log"))
	require.NoError(t, err)
	require.Equal(t, "gc 1 @0.5s\n", string(b))
	p.keepLog("hosts-host1.log", filepath.Join(dir, "missing"), note)
	require.Len(t, notes, 1)
	require.Contains(t, notes[0], "host log hosts-host1.log not saved")
}

// A run's Redis latency events are kept with their second: a slow
// command (a script that spins 20 ms) is one, and the slow log names it,
// its arguments clipped.
func TestRedisLatencyIsKept(t *testing.T) {
	url, _ := testserver.Redis(t)
	opt, err := redis.ParseURL(url)
	require.NoError(t, err)
	dir := t.TempDir()
	dump, err := watchRedisLatency(context.Background(), opt.Addr, dir)
	require.NoError(t, err)
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	require.NoError(t, rdb.Eval(context.Background(), `local t = redis.call('TIME')
repeat local n = redis.call('TIME') until (n[1] - t[1]) * 1000000 + (n[2] - t[2]) > 20000
return 1`, nil).Err())
	dump()
	b, err := os.ReadFile(filepath.Join(dir, "redis-latency.txt"))
	require.NoError(t, err)
	require.Regexp(t, `(?m)^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ command \d+$`, string(b))
	require.Regexp(t, `(?m)^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \d+\.\d eval local t = redis.call\('TIME'\) repeat local n = re… 0$`, string(b))
}

// The metrics summary lists the protean_ counters that grew over the
// phase, with their labels; gauges, other counters and unchanged ones are
// left out, and a sample that appeared during the phase counts from 0.
func TestCounterDeltasListWhatMoved(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	start, end := filepath.Join(dir, "start.txt"), filepath.Join(dir, "end.txt")
	require.NoError(t, os.WriteFile(start, []byte(`# TYPE protean_module_instances_created_total counter
protean_module_instances_created_total{module="orders"} 4
protean_module_instances_created_total{module="shipping"} 2
# TYPE protean_pool_waits_total counter
protean_pool_waits_total{pool="postgres"} 10
# TYPE protean_instances gauge
protean_instances 3
# TYPE go_gc_cycles_total counter
go_gc_cycles_total 1
`), 0o644))
	require.NoError(t, os.WriteFile(end, []byte(`# TYPE protean_module_instances_created_total counter
protean_module_instances_created_total{module="orders"} 20
protean_module_instances_created_total{module="shipping"} 2
# TYPE protean_pool_waits_total counter
protean_pool_waits_total{pool="postgres"} 10
protean_pool_waits_total{pool="redis"} 7.5
# TYPE protean_instances gauge
protean_instances 9
# TYPE go_gc_cycles_total counter
go_gc_cycles_total 30
`), 0o644))
	lines, err := counterDeltas(start, end)
	require.NoError(t, err)
	require.Equal(t, []string{
		"counters that moved over the phase (growth, sample):",
		`            16  protean_module_instances_created_total{module="orders"}`,
		`           7.5  protean_pool_waits_total{pool="redis"}`,
	}, lines)

	_, err = counterDeltas("", end)
	require.ErrorContains(t, err, "no metrics from the phase's start")
	require.NoError(t, os.WriteFile(start, []byte("not { an exposition\n"), 0o644))
	_, err = counterDeltas(start, end)
	require.ErrorContains(t, err, "start.txt")
}
