// Package loadgen measures the production path end to end over HTTP, beside
// its floor in the same run: a private PostgreSQL and Redis (package
// chaos starts them), then for each configuration (the floor, one host,
// three hosts) clients that each place an order (POST
// /v1/commands/PlaceOrder) and read their projection with
// ?min_position=N, first unpaced (the sustained maximum), then paced at
// half that rate (the latency at half load).
//
// The floor is what the path cannot beat, written directly against the
// same servers with pgx and go-redis: per order BEGIN, INSERT, COMMIT,
// XADD to the client's stream; one consumer per stream blocked in
// XREADGROUP upserts the client's row and XACKs; the client waits for
// that upsert. "floor+lock" is the same with the one advisory lock per
// category that the event store takes until commit (MessageDB's
// discipline, so that a category's commits follow global position
// order): what PostgreSQL itself allows one category. Accepted → projection is from the command's answer (the
// floor: its XADD) to the projection read's answer (the floor: the
// upsert's commit).
package loadgen

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/proteanhq/protean-host/internal/chaos"
	"github.com/proteanhq/protean-host/internal/serverbin"
)

// Options configure a run.
type Options struct {
	Bin     string // the protean-host binary (make build)
	Plugins string // the example modules (make plugins)
	Root    string // the repository (configs/production.toml)
	Hosts   []int  // host counts to measure (default 1 and 3)
	Clients int    // concurrent clients (default 64)
	// Duration is how long each phase (maximum, half load) of each
	// configuration runs (default 20 s).
	Duration time.Duration
	// PostgresPool and RedisPool, when set, are the hosts' pool sizes
	// (pool_max_conns and pool_size in their URIs) instead of the sizes
	// each host derives.
	PostgresPool, RedisPool int
	// RedisFsync is Redis's appendfsync policy for the floor and the
	// hosts alike. The default, chaos.FsyncEverySec, puts Redis in the
	// class PostgreSQL runs in here (fsync off): both keep what they
	// acknowledged across a kill of their process, not across a crash of
	// the machine. chaos.FsyncAlways makes every Redis write wait for the
	// disk, whose stalls then set the tail (docs/benchmarks.md).
	RedisFsync chaos.Fsync
	// KeysPerClient: a client moves to a new client_id every this many
	// orders, so no projection document grows without bound (default 50).
	KeysPerClient int
	// Profile, when set, is a directory for each host's CPU, block and
	// mutex profiles and goroutine dump over each configuration's
	// maximum phase, and summary.txt: every process's CPU over the
	// phase and the profiles' top entries (hosts run with [http] pprof);
	// also each host configuration's half-load orders in time
	// ({config}-orders.csv, profiler.keepOrders), the hosts' logs, and
	// Redis's latency events (redis-latency.txt, watchRedisLatency).
	Profile string
	// Compare are settings ("plugins.document_cache_mb=0", see
	// chaos.ParseSetting), each measured after the host counts as one
	// more configuration: CompareHosts hosts with that setting, on the
	// same servers, so that a change is measured on and off in one run.
	Compare []string
	// CompareHosts is how many hosts each Compare setting, CompareBins
	// binary and ComparePlugins directory runs on (0: 1).
	CompareHosts int
	// CompareBins are other protean-host binaries (a build of another
	// commit), each measured as one more configuration on CompareHosts
	// hosts, on the same servers: a code change before and after in one
	// run.
	CompareBins []string
	// ComparePlugins are directories of modules, each measured as one
	// more configuration on CompareHosts hosts: Plugins with the
	// directory's modules in place of their namesakes (build/plugins-c:
	// the examples written in C), so a guest's share of the path is
	// measured in one run.
	ComparePlugins []string
	// Rounds is how many times the whole run (the floor, the host counts,
	// each comparison) is measured, on the same servers (0: 1). Rounds
	// after the first leave floor+lock out, and every second round
	// measures the host configurations in reverse order, so that no
	// configuration always meets the tables the others grew (an A B / B A
	// design); Table then gives each configuration's medians over the
	// rounds, its ratio to the floor taken within each round.
	Rounds int
	Out    io.Writer
}

// Row is one configuration's figures.
type Row struct {
	Name string
	// MaxRate is the sustained orders per second, each followed by its
	// projection read, with unpaced clients.
	MaxRate float64
	// HalfRate is the rate the half-load phase reached; P50 and P99 are
	// accepted → projection there; Misses are reads that ended without
	// the order (a 504 past the read wait, or an error).
	HalfRate float64
	P50, P99 time.Duration
	Misses   int
	// CmdP50 and CmdP99 are the commands' own latency (the POST's round
	// trip; the floor: BEGIN to XADD) in the maximum phase: where an
	// order's time goes when the path is saturated.
	CmdP50, CmdP99 time.Duration
	// Split is how many of the half-load phase's orders had their event's
	// publish found in the outbox (hosts only: the floor has none), which
	// splits each one's accepted → projection in two: accepted → published
	// (PubP50, PubP99: the relay's share after the command's answer, below
	// zero when it published before the client read the answer) and
	// published → read (ReadP50, ReadP99: the partition worker, the
	// projector, its commit and the read's answer). TailPub and TailRead
	// are the medians of the two parts over the slowest 1 % of the orders:
	// where the p99 goes.
	Split             int
	PubP50, PubP99    time.Duration
	ReadP50, ReadP99  time.Duration
	TailPub, TailRead time.Duration
	// NewKeys is how many of the split orders were the first of their
	// key (a client moves to a new key every KeysPerClient orders, and a
	// new key's first event reaches a unit no host holds yet);
	// NewKeyP99 and OldKeyP99 are the accepted → projection p99 of those
	// and of the rest, and TailNewKeys how many of the slowest 1 % were
	// new keys' first orders.
	NewKeys, TailNewKeys int
	NewKeyP99, OldKeyP99 time.Duration
	// Round is the round (from 0) the row was measured in (Options.Rounds).
	Round      int
	halfOrders []placedOrder
	published  map[int64]time.Time // by global position (splitAtPublish)
	// halfFrom and halfTo bound the half-load phase.
	halfFrom, halfTo time.Time
}

// Run starts the servers, measures the floor and each host count, and
// returns the rows, the floor first.
func Run(ctx context.Context, o Options) (_ []Row, err error) {
	o.setDefaults()
	dir, err := os.MkdirTemp("", "protean-loadgen-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil { // PostgreSQL runs as postgres under root
		return nil, err
	}
	var settings []string
	statementStats := false
	if o.Profile != "" {
		settings, statementStats = statementsSettings()
	}
	pg, err := chaos.StartPostgres(ctx, dir, settings...)
	if err != nil {
		return nil, err
	}
	defer pg.Stop(false)
	if statementStats {
		defer func() { // its slow statements' plans (auto_explain)
			if b, rerr := os.ReadFile(pg.Log()); rerr == nil {
				_ = os.WriteFile(filepath.Join(o.Profile, "postgres.log"), b, 0o644)
			}
		}()
	}
	if o.RedisFsync == "" {
		o.RedisFsync = chaos.FsyncEverySec
	}
	rs, err := chaos.StartRedisFsync(ctx, dir, o.RedisFsync)
	if err != nil {
		return nil, err
	}
	defer rs.Stop(false)
	note := func(format string, args ...any) { fmt.Fprintf(o.Out, format+"\n", args...) }
	var prof *profiler
	if o.Profile != "" {
		if prof, err = newProfiler(o.Profile, dir); err != nil {
			return nil, err
		}
		if !statementStats {
			note("pg_stat_statements or auto_explain is not installed beside PostgreSQL: the summary has no statements")
		} else if prof.pg, err = openStatements(ctx, chaos.URL(pg.Addr())); err != nil {
			note("the summary has no statements: %v", err)
		}
		defer prof.pg.close()
		if dump, err := watchRedisLatency(ctx, rs.Addr(), o.Profile); err != nil {
			note("Redis's latency is not watched: %v", err)
		} else {
			defer dump()
		}
		defer func() {
			if werr := os.WriteFile(filepath.Join(o.Profile, "summary.txt"), []byte(prof.summary(ctx)), 0o644); werr != nil && err == nil {
				err = werr
			}
		}()
	}
	note("PostgreSQL on %s (fsync off), Redis on %s (appendfsync %s); %d clients, %s per phase", pg.Addr(), rs.Addr(), o.RedisFsync, o.Clients, o.Duration)

	fl, err := newFloor(ctx, chaos.URL(pg.Addr()), "redis://"+rs.Addr()+"/0")
	if err != nil {
		return nil, err
	}
	defer fl.close()
	dbURL, redisURL := chaos.URL(pg.Addr()), "redis://"+rs.Addr()+"/0"
	if o.PostgresPool > 0 {
		dbURL += fmt.Sprintf("&pool_max_conns=%d", o.PostgresPool)
	}
	if o.RedisPool > 0 {
		redisURL += fmt.Sprintf("?pool_size=%d", o.RedisPool)
	}
	cfg := chaos.HostConfig{
		DatabaseURL: dbURL, RedisURL: redisURL,
		CacheDir: filepath.Join(dir, "wasm-cache"), LeaseTTL: 15 * time.Second, Pprof: prof != nil,
	}
	groups, err := hostGroups(o, cfg, dir)
	if err != nil {
		return nil, err
	}
	var rows []Row
	for r := range o.Rounds {
		suffix := ""
		if o.Rounds > 1 {
			suffix = fmt.Sprintf(" (round %d)", r+1)
			note("round %d of %d", r+1, o.Rounds)
		}
		add := func(row Row, name string) {
			row.Name, row.Round = name, r
			rows = append(rows, row)
		}
		fl.lock = false
		add(measure(ctx, o, "floor"+suffix, fl.order, prof, nil, nil), "floor")
		fl.stopReaders()
		note("%s", rows[len(rows)-1])
		if r == 0 {
			fl.lock = true
			add(measure(ctx, o, "floor+lock", fl.order, prof, nil, nil), "floor+lock")
			fl.stopReaders()
			note("%s", rows[len(rows)-1])
		}
		for i, g := range roundOrder(groups, r) {
			sub := filepath.Join(dir, fmt.Sprintf("round%d-group%d", r, i))
			if err := os.Mkdir(sub, 0o755); err != nil {
				return rows, err
			}
			measured, err := measureHosts(ctx, g.o, sub, g.label, suffix, g.cfg, prof, note)
			for _, row := range measured {
				add(row, row.Name)
			}
			if err != nil {
				return rows, err
			}
		}
	}
	return rows, nil
}

// hostGroup is a set of host configurations measured together (one start
// of hosts, each count of o.Hosts in turn): the run's own, or one
// comparison.
type hostGroup struct {
	label string // after the host count in a row's name: "", " [setting]"
	o     Options
	cfg   chaos.HostConfig
}

// hostGroups is the run's host configurations: o.Hosts on cfg, then each
// Compare setting, each CompareBins binary and each ComparePlugins
// directory on CompareHosts hosts; the plugins directories they run are
// composed under dir.
func hostGroups(o Options, cfg chaos.HostConfig, dir string) ([]hostGroup, error) {
	groups := []hostGroup{{o: o, cfg: cfg}}
	one := o
	one.Hosts = []int{max(o.CompareHosts, 1)}
	for _, setting := range o.Compare {
		key, value, err := chaos.ParseSetting(setting)
		if err != nil {
			return nil, err
		}
		c := cfg
		c.Settings = map[string]any{key: value}
		groups = append(groups, hostGroup{label: " [" + setting + "]", o: one, cfg: c})
	}
	for _, bin := range o.CompareBins {
		if _, err := os.Stat(bin); err != nil {
			return nil, fmt.Errorf("-compare-bin: %w", err)
		}
		b := one
		b.Bin = bin
		groups = append(groups, hostGroup{label: " [" + filepath.Base(bin) + "]", o: b, cfg: cfg})
	}
	for i, replace := range o.ComparePlugins {
		composed := filepath.Join(dir, fmt.Sprintf("plugins-%d", i))
		if err := composePlugins(composed, o.Plugins, replace); err != nil {
			return nil, fmt.Errorf("-compare-plugins: %w", err)
		}
		p := one
		p.Plugins = composed
		groups = append(groups, hostGroup{label: " [" + filepath.Base(replace) + "]", o: p, cfg: cfg})
	}
	return groups, nil
}

// composePlugins makes dir a plugins directory of the modules of base,
// with those of replace in place of their namesakes (and replace's others
// added). A replace without a module is refused: it would measure base
// again under another name.
func composePlugins(dir, base, replace string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, from := range []string{base, replace} {
		mods, err := filepath.Glob(filepath.Join(from, "*.wasm"))
		if err != nil {
			return err
		}
		if from == replace && len(mods) == 0 {
			return fmt.Errorf("%s holds no module (*.wasm)", replace)
		}
		for _, m := range mods {
			b, err := os.ReadFile(m)
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, filepath.Base(m)), b, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// roundOrder is the order in which round r measures groups: as given in
// even rounds, reversed in odd ones.
func roundOrder[T any](groups []T, r int) []T {
	if r%2 == 0 {
		return groups
	}
	rev := slices.Clone(groups)
	slices.Reverse(rev)
	return rev
}

// setDefaults fills in the options left zero.
func (o *Options) setDefaults() {
	if len(o.Hosts) == 0 {
		o.Hosts = []int{1, 3}
	}
	if o.Clients <= 0 {
		o.Clients = 64
	}
	if o.Duration <= 0 {
		o.Duration = 20 * time.Second
	}
	if o.KeysPerClient <= 0 {
		o.KeysPerClient = 50
	}
	if o.Rounds <= 0 {
		o.Rounds = 1
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
}

// measureHosts measures each host count of o.Hosts in turn, starting
// hosts (configured by cfg, in dir) as a count needs them and stopping
// them all at the end, and returns a row for each count, named "N
// host(s)" and label; suffix (the round, see Options.Rounds) tells the
// measurement's clients, profiles and logs apart from other rounds'.
func measureHosts(ctx context.Context, o Options, dir, label, suffix string, cfg chaos.HostConfig, prof *profiler, note func(string, ...any)) ([]Row, error) {
	var hosts []*chaos.Host
	defer func() {
		for i, h := range hosts {
			_ = h.Stop()
			if prof != nil {
				prof.keepLog(fmt.Sprintf("hosts%s-host%d.log", configSlug(label+suffix), i), h.LogFile(), note)
			}
		}
	}()
	base := filepath.Join(o.Root, "configs", "production.toml")
	var rows []Row
	for _, n := range o.Hosts {
		for len(hosts) < n {
			h, err := startHost(ctx, o, len(hosts), dir, base, cfg, note)
			if err != nil {
				return rows, err
			}
			hosts = append(hosts, h)
		}
		name := fmt.Sprintf("%d host(s)", n) + label
		row, err := measureOver(ctx, o, name+suffix, hosts[:n], prof, note)
		if err != nil {
			return rows, err
		}
		if err := splitFromOutbox(ctx, cfg.DatabaseURL, &row); err != nil {
			note("%s: the split at the publish is not known: %v", row.Name, err)
		} else if prof != nil {
			prof.keepOrders(row, note)
		}
		note("%s", row)
		row.Name = name
		rows = append(rows, row)
	}
	return rows, nil
}

// splitFromOutbox fills in row's split at the publish (Row.Split) from the outbox
// at url.
func splitFromOutbox(ctx context.Context, url string, row *Row) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	published, err := publishedAt(ctx, pool, row.halfFrom, row.halfTo)
	if err != nil {
		return err
	}
	row.splitAtPublish(published)
	return nil
}

// startHost starts host i with cfg on a free port; the first host migrates
// the database before it starts.
func startHost(ctx context.Context, o Options, i int, dir, base string, cfg chaos.HostConfig, note func(string, ...any)) (*chaos.Host, error) {
	port, err := serverbin.FreePort()
	if err != nil {
		return nil, err
	}
	cfg.Listen = fmt.Sprintf("127.0.0.1:%d", port)
	h, err := chaos.NewHost(i, dir, o.Bin, base, o.Plugins, cfg, note)
	if err != nil {
		return nil, err
	}
	if i == 0 {
		if out, err := exec.CommandContext(ctx, o.Bin, "migrate", "--config", h.Config()).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("migrate: %v: %s", err, out)
		}
	}
	if err := h.Start(ctx); err != nil {
		return nil, err
	}
	return h, nil
}

// measureOver measures the configuration of hosts, named name, each order
// sent to one of them in turn by its sequence number, after a warm-up.
func measureOver(ctx context.Context, o Options, name string, hosts []*chaos.Host, prof *profiler, note func(string, ...any)) (Row, error) {
	addrs := make([]string, len(hosts))
	for i, h := range hosts {
		addrs[i] = h.Addr
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.Clients}, Timeout: 30 * time.Second}
	half := &stageLog{}
	order := func(ctx context.Context, client, key string, seq int) (time.Duration, time.Duration, error) {
		p, command, err := httpOrder(ctx, hc, addrs[seq%len(addrs)], client, key, seq)
		if err == nil {
			p.newKey = seq%o.KeysPerClient == 0
			half.add(p)
		}
		return p.read.Sub(p.accepted), command, err
	}
	began := time.Now()
	if err := warmUp(ctx, o, name, hosts, order); err != nil {
		return Row{Name: name}, fmt.Errorf("%s: warm-up: %w", name, err)
	}
	note("%s: warmed up in %s (modules compiled, one order per client)", name, time.Since(began).Round(time.Millisecond))
	return measure(ctx, o, name, order, prof, hosts, half), nil
}

// warmUp waits until every host has compiled the modules it loaded
// without compiling (a start compiles them in the background), then
// places one order per client on each host, unmeasured: a module
// compiled on its first call compiles here, and the clients' connections
// open here. Without it the maximum phase measured the compiles: 46 % of
// a host's CPU in that phase, after a start stopped compiling before it
// served.
func warmUp(ctx context.Context, o Options, name string, hosts []*chaos.Host, order orderFunc) error {
	for _, h := range hosts {
		if err := h.Compiled(ctx); err != nil {
			return err
		}
	}
	label := configSlug(name)
	errs := make([]error, o.Clients*len(hosts))
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() {
			client := fmt.Sprintf("%s-warmup-c%d", label, i)
			_, _, errs[i] = order(ctx, client, client+"-k0", i)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// orderFunc places one order of key as client (its seq-th) and waits
// until its projection has it: the time from accepted to projected, and
// the command's own.
type orderFunc func(ctx context.Context, client, key string, seq int) (projected, command time.Duration, _ error)

// measure runs the maximum phase, then the half-load phase, of one
// configuration; prof (nil: none) profiles hosts over the maximum phase,
// and half (nil: none) logs the half-load phase's orders.
func measure(ctx context.Context, o Options, name string, order orderFunc, prof *profiler, hosts []*chaos.Host, half *stageLog) Row {
	row := Row{Name: name}
	done := func(int) {}
	if prof != nil {
		done = prof.watch(ctx, name, hosts, o.Duration)
	}
	n, _, cmds, _ := phase(ctx, o, name+"/max", order, 0)
	done(n)
	row.MaxRate = float64(n) / o.Duration.Seconds()
	if len(cmds) > 0 {
		row.CmdP50, row.CmdP99 = percentiles(cmds)
	}
	pace := time.Duration(float64(time.Second) * float64(o.Clients) / (row.MaxRate / 2))
	row.halfFrom = time.Now()
	half.set(true)
	m, lat, _, misses := phase(ctx, o, name+"/half", order, pace)
	row.halfOrders = half.set(false)
	row.halfTo = time.Now()
	row.HalfRate = float64(m) / o.Duration.Seconds()
	row.Misses = misses
	if len(lat) > 0 {
		row.P50, row.P99 = percentiles(lat)
	}
	return row
}

// phase runs o.Clients clients for o.Duration, each starting an order
// every pace (0: as soon as the last was projected), and returns the
// orders projected, their latencies (accepted → projected, and the
// commands') and the misses.
func phase(ctx context.Context, o Options, label string, order orderFunc, pace time.Duration) (int, []time.Duration, []time.Duration, int) {
	var mu sync.Mutex
	var lat, cmds []time.Duration
	done, misses := 0, 0
	end := time.Now().Add(o.Duration)
	var wg sync.WaitGroup
	for c := 0; c < o.Clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := fmt.Sprintf("%s-c%d", strings.NewReplacer(" ", "", "(", "", ")", "", "/", "-").Replace(label), c)
			next := time.Now().Add(time.Duration(c) * pace / time.Duration(max(o.Clients, 1)))
			for seq := 0; ctx.Err() == nil; seq++ {
				if pace > 0 {
					time.Sleep(time.Until(next))
					next = next.Add(pace)
				}
				if time.Now().After(end) {
					return
				}
				key := fmt.Sprintf("%s-k%d", client, seq/o.KeysPerClient)
				d, cmd, err := order(ctx, client, key, seq)
				mu.Lock()
				if err != nil {
					misses++
				} else {
					done++
					lat, cmds = append(lat, d), append(cmds, cmd)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return done, lat, cmds, misses
}

// httpOrder is one order through a host's HTTP API.
func httpOrder(ctx context.Context, hc *http.Client, host, client, key string, seq int) (placedOrder, time.Duration, error) {
	var p placedOrder
	body := fmt.Sprintf(`{"order_id":"%s-o%d","client_id":%q,"total":1}`, client, seq, key)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+host+"/v1/commands/PlaceOrder", bytes.NewBufferString(body))
	if err != nil {
		return p, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	sent := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return p, 0, err
	}
	var answer struct {
		Events []struct {
			GlobalPosition int64 `json:"global_position"`
		} `json:"events"`
	}
	err = json.NewDecoder(resp.Body).Decode(&answer)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || len(answer.Events) == 0 {
		return p, 0, fmt.Errorf("command answered %d (%v)", resp.StatusCode, err)
	}
	p.accepted, p.gp = time.Now(), answer.Events[0].GlobalPosition
	command := p.accepted.Sub(sent)
	url := fmt.Sprintf("http://%s/v1/projections/client_orders/%s?min_position=%d", host, key, p.gp)
	req, err = http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return p, 0, err
	}
	resp, err = hc.Do(req)
	if err != nil {
		return p, 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return p, 0, fmt.Errorf("projection read answered %d", resp.StatusCode)
	}
	p.read = time.Now()
	return p, command, nil
}

func (r Row) String() string {
	s := fmt.Sprintf("%-10s max %7.1f orders/s (command p50 %s p99 %s) | half load %7.1f orders/s, accepted → projection p50 %s p99 %s, %d missed",
		r.Name, r.MaxRate, r.CmdP50.Round(10*time.Microsecond), r.CmdP99.Round(10*time.Microsecond), r.HalfRate,
		r.P50.Round(10*time.Microsecond), r.P99.Round(10*time.Microsecond), r.Misses)
	if r.Split > 0 {
		ms := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
		s += fmt.Sprintf("; split at the publish (%d orders): accepted → published p50 %s p99 %s, published → read p50 %s p99 %s; the slowest 1%%: published %s after accepted, read %s after that (medians)",
			r.Split, ms(r.PubP50), ms(r.PubP99), ms(r.ReadP50), ms(r.ReadP99), ms(r.TailPub), ms(r.TailRead))
		s += fmt.Sprintf("; a new key's first order (%d): p99 %s, the others p99 %s; %d of the slowest 1%% were new keys' first",
			r.NewKeys, ms(r.NewKeyP99), ms(r.OldKeyP99), r.TailNewKeys)
	}
	return s
}

// publishedAt reads, from the outbox, when each event committed between
// from and to was published, by its global position.
func publishedAt(ctx context.Context, pool *pgxpool.Pool, from, to time.Time) (map[int64]time.Time, error) {
	rows, err := pool.Query(ctx, `SELECT (metadata->>'global_position')::bigint, published_at FROM outbox
		WHERE status = 'published' AND created_at >= $1 AND created_at < $2 AND metadata->>'global_position' ~ '^[0-9]+$'`, from, to)
	if err != nil {
		return nil, err
	}
	out := map[int64]time.Time{}
	var gp int64
	var at time.Time
	_, err = pgx.ForEachRow(rows, []any{&gp, &at}, func() error {
		out[gp] = at
		return nil
	})
	return out, err
}

// splitAtPublish splits each half-load order's accepted → projection at
// its event's publish (published: by global position), filling in
// Split, PubP50..TailRead.
func (r *Row) splitAtPublish(published map[int64]time.Time) {
	r.published = published
	type split struct {
		total, pub, read time.Duration
		newKey           bool
	}
	var all []split
	var newKeys, oldKeys []time.Duration
	for _, o := range r.halfOrders {
		at, ok := published[o.gp]
		if !ok {
			continue
		}
		total := o.read.Sub(o.accepted)
		all = append(all, split{total: total, pub: at.Sub(o.accepted), read: o.read.Sub(at), newKey: o.newKey})
		if o.newKey {
			newKeys = append(newKeys, total)
		} else {
			oldKeys = append(oldKeys, total)
		}
	}
	r.Split = len(all)
	if len(all) == 0 {
		return
	}
	pubs, reads := make([]time.Duration, len(all)), make([]time.Duration, len(all))
	for i, s := range all {
		pubs[i], reads[i] = s.pub, s.read
	}
	r.PubP50, r.PubP99 = percentiles(pubs)
	r.ReadP50, r.ReadP99 = percentiles(reads)
	slices.SortFunc(all, func(a, b split) int { return cmp.Compare(b.total, a.total) })
	r.NewKeys = len(newKeys)
	if len(newKeys) > 0 {
		_, r.NewKeyP99 = percentiles(newKeys)
	}
	if len(oldKeys) > 0 {
		_, r.OldKeyP99 = percentiles(oldKeys)
	}
	tail := all[:max(1, len(all)/100)]
	pubs, reads = pubs[:0], reads[:0]
	for _, s := range tail {
		pubs, reads = append(pubs, s.pub), append(reads, s.read)
		if s.newKey {
			r.TailNewKeys++
		}
	}
	r.TailPub, _ = percentiles(pubs)
	r.TailRead, _ = percentiles(reads)
}

// percentiles sorts ds and returns its p50 and p99.
func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(ds)
	return ds[(len(ds)-1)*50/100], ds[(len(ds)-1)*99/100]
}

// placedOrder is one order through a host: its event's global position,
// when the client had the command's answer, and when it had the
// projection's, and whether it was the first order of its key.
type placedOrder struct {
	gp             int64
	accepted, read time.Time
	newKey         bool // the first order of its key
}

// stageLog keeps, while on, the orders placed through the hosts: the
// half-load phase's, which Row.splitAtPublish splits. set on a nil log
// (the floor's) does nothing.
type stageLog struct {
	mu     sync.Mutex
	on     bool
	orders []placedOrder
}

func (l *stageLog) add(p placedOrder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.on {
		l.orders = append(l.orders, p)
	}
}

// set turns the log on or off and returns what it holds.
func (l *stageLog) set(on bool) []placedOrder {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on = on
	return l.orders
}

// Table renders rows as a Markdown table with each row's throughput as a
// ratio of the floor's of its round. Rows of several rounds
// (Options.Rounds) become one line per configuration: the medians over
// its rounds, and the lowest and highest of its ratios.
func Table(rows []Row) string {
	var b strings.Builder
	floors := map[int]float64{} // each round's floor
	for _, r := range rows {
		if r.Name == "floor" {
			floors[r.Round] = r.MaxRate
		}
	}
	ratio := func(r Row) float64 {
		if floors[r.Round] > 0 {
			return r.MaxRate / floors[r.Round]
		}
		return 0
	}
	ms := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	if len(floors) <= 1 {
		b.WriteString("| | orders/s (max) | × floor | command p50 / p99 at max | orders/s (half load) | accepted → projection p50 / p99 | missed |\n|---|---|---|---|---|---|---|\n")
		for _, r := range rows {
			fmt.Fprintf(&b, "| %s | %.0f | %.2f× | %s / %s | %.0f | %s / %s | %d |\n", r.Name, r.MaxRate, ratio(r),
				ms(r.CmdP50), ms(r.CmdP99), r.HalfRate, ms(r.P50), ms(r.P99), r.Misses)
		}
		return b.String()
	}
	// Several rounds: each configuration's medians, and the range of its
	// ratio to its round's floor.
	var names []string
	by := map[string][]Row{}
	for _, r := range rows {
		if _, ok := by[r.Name]; !ok {
			names = append(names, r.Name)
		}
		by[r.Name] = append(by[r.Name], r)
	}
	fmt.Fprintf(&b, "Medians over %d rounds (each ratio to its own round's floor; min–max in brackets):\n\n", len(floors))
	b.WriteString("| | rounds | orders/s (max) | × floor | command p50 / p99 at max | orders/s (half load) | accepted → projection p50 / p99 | missed |\n|---|---|---|---|---|---|---|---|\n")
	for _, name := range names {
		rs := by[name]
		f := func(v func(Row) float64) float64 { return median(rs, v) }
		d := func(v func(Row) time.Duration) time.Duration {
			return ms(time.Duration(f(func(r Row) float64 { return float64(v(r)) })))
		}
		lo, hi, misses := ratio(rs[0]), ratio(rs[0]), 0
		for _, r := range rs {
			lo, hi, misses = min(lo, ratio(r)), max(hi, ratio(r)), misses+r.Misses
		}
		fmt.Fprintf(&b, "| %s | %d | %.0f | %.2f× (%.2f–%.2f) | %s / %s | %.0f | %s / %s | %d |\n", name, len(rs),
			f(func(r Row) float64 { return r.MaxRate }), f(ratio), lo, hi,
			d(func(r Row) time.Duration { return r.CmdP50 }), d(func(r Row) time.Duration { return r.CmdP99 }),
			f(func(r Row) float64 { return r.HalfRate }),
			d(func(r Row) time.Duration { return r.P50 }), d(func(r Row) time.Duration { return r.P99 }), misses)
	}
	return b.String()
}

// median is the median of v over rows (the mean of the middle two for an
// even count).
func median(rows []Row, v func(Row) float64) float64 {
	xs := make([]float64, len(rows))
	for i, r := range rows {
		xs[i] = v(r)
	}
	slices.Sort(xs)
	n := len(xs)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// floor is the raw commit-and-publish path.
type floor struct {
	// lock takes the category's advisory lock in the commit, as the
	// event store does (MessageDB's discipline: commits of one category
	// follow global position order), so every order of the category
	// commits one after another: what PostgreSQL itself allows the path.
	lock bool
	pool *pgxpool.Pool
	rdb  *redis.Client
	mu   sync.Mutex
	// waiting maps a client's stream to the channel its order waits on.
	waiting map[string]chan time.Time
	readers map[string]bool
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func newFloor(ctx context.Context, pgURL, redisURL string) (*floor, error) {
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS floor_events (id BIGSERIAL PRIMARY KEY, client TEXT NOT NULL, data JSONB NOT NULL);
		CREATE TABLE IF NOT EXISTS floor_projection (client TEXT PRIMARY KEY, orders BIGINT NOT NULL)`); err != nil {
		pool.Close()
		return nil, err
	}
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		pool.Close()
		return nil, err
	}
	opt.PoolSize = 256
	f := &floor{pool: pool, rdb: redis.NewClient(opt), waiting: map[string]chan time.Time{}, readers: map[string]bool{}}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	return f, nil
}

func (f *floor) close() {
	f.stopReaders()
	_ = f.rdb.Close()
	f.pool.Close()
}

// stopReaders ends the streams' consumers, after a configuration: each
// holds a connection of the Redis pool in its blocked read, so readers
// kept from one configuration to the next would fill the pool (256)
// within two configurations of 64 clients' two phases.
func (f *floor) stopReaders() {
	f.cancel()
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.waiting, f.readers = map[string]chan time.Time{}, map[string]bool{}
}

// order: BEGIN/INSERT/COMMIT, XADD to the key's stream, then wait for
// the stream's consumer to upsert the projection row.
func (f *floor) order(ctx context.Context, client, key string, seq int) (time.Duration, time.Duration, error) {
	stream := "floor:" + client
	f.mu.Lock()
	ch := f.waiting[stream]
	if ch == nil {
		ch = make(chan time.Time, 1)
		f.waiting[stream] = ch
	}
	if !f.readers[stream] {
		f.readers[stream] = true
		if err := f.rdb.XGroupCreateMkStream(ctx, stream, "proj", "$").Err(); err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
			f.mu.Unlock()
			return 0, 0, err
		}
		f.wg.Add(1)
		go f.consume(f.ctx, stream, ch)
	}
	f.mu.Unlock()
	sent := time.Now()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		return 0, 0, err
	}
	if f.lock {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(42)`); err != nil {
			_ = tx.Rollback(ctx)
			return 0, 0, err
		}
	}
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO floor_events (client, data) VALUES ($1, $2) RETURNING id`, key,
		fmt.Sprintf(`{"order":%d}`, seq)).Scan(&id); err != nil {
		_ = tx.Rollback(ctx)
		return 0, 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, 0, err
	}
	if err := f.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"key", key, "id", id}}).Err(); err != nil {
		return 0, 0, err
	}
	accepted := time.Now()
	select {
	case at := <-ch:
		return at.Sub(accepted), accepted.Sub(sent), nil
	case <-time.After(5 * time.Second):
		return 0, 0, errors.New("floor: projection not updated within 5 s")
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
}

// consume is one stream's consumer until ctx ends: XREADGROUP BLOCK,
// upsert, XACK.
func (f *floor) consume(ctx context.Context, stream string, ch chan time.Time) {
	defer f.wg.Done()
	for ctx.Err() == nil {
		res, err := f.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "proj", Consumer: "c", Streams: []string{stream, ">"}, Count: 64, Block: time.Second}).Result()
		if err != nil {
			continue
		}
		for _, st := range res {
			for _, m := range st.Messages {
				key, _ := m.Values["key"].(string)
				if _, err := f.pool.Exec(ctx, `INSERT INTO floor_projection (client, orders) VALUES ($1, 1)
					ON CONFLICT (client) DO UPDATE SET orders = floor_projection.orders + 1`, key); err != nil {
					continue
				}
				_ = f.rdb.XAck(ctx, stream, "proj", m.ID).Err()
				select {
				case ch <- time.Now():
				default:
				}
			}
		}
	}
}
