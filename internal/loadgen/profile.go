package loadgen

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/proteanhq/protean-host/internal/chaos"
)

// profileMargin is how much shorter than the maximum phase the CPU, block,
// mutex and allocation profiles are, so that they end inside it.
const profileMargin = time.Second

// fetchSlack bounds a profile's fetch beyond the seconds it covers.
const fetchSlack = 15 * time.Second

// profiler saves, during each configuration's maximum phase, every host's
// CPU, block, mutex and allocation profiles, a goroutine dump and its
// metrics at the phase's start and end under dir, and
// accounts the CPU of each process of the run over the phase.
type profiler struct {
	dir    string
	runDir string // the run's directory, where PostgreSQL's data is
	proc   string // /proc
	hc     *http.Client
	// pg reads PostgreSQL's statement statistics over each phase; nil
	// when the server runs without pg_stat_statements.
	pg      *statements
	mu      sync.Mutex
	records []phaseRecord
}

// phaseRecord is what one configuration's maximum phase left for the
// summary.
type phaseRecord struct {
	config string
	wall   time.Duration
	cpu    []procCPU
	// machine is the busy CPU of the whole machine over the phase, -1
	// when /proc/stat is unreadable.
	machine time.Duration
	files   []savedProfile
	errs    []string
	// orders is how many orders the phase completed; statements and
	// topStatements are PostgreSQL's figures over it (pg set).
	orders        int
	statements    statementStat
	topStatements []statementStat
}

// procCPU is one process's CPU over a phase; a process not running at
// either end has used -1.
type procCPU struct {
	name string
	used time.Duration
}

// savedProfile is one file the profiler saved.
type savedProfile struct {
	host int
	kind string // cpu, block, mutex, allocs, goroutines, metrics-start, metrics-end
	path string
}

func newProfiler(dir, runDir string) (*profiler, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// No client timeout: each fetch has its own deadline, as long as the
	// profile it waits for.
	return &profiler{dir: dir, runDir: runDir, proc: "/proc", hc: &http.Client{}}, nil
}

// account is a process the CPU accounting follows: tree counts its
// descendants (PostgreSQL's backends) too.
type account struct {
	name string
	pid  int
	tree bool
}

// accounts finds this run's processes: the hosts (children of this
// process running their config), PostgreSQL (its postmaster's pid file),
// Redis (the child redis-server) and loadgen itself.
func (p *profiler) accounts(procs map[int]procStat, hosts []*chaos.Host) []account {
	self := os.Getpid()
	var out []account
	for _, h := range hosts {
		out = append(out, account{fmt.Sprintf("host%d", h.Index), childWith(procs, p.proc, self, "", h.Config()), true})
	}
	pg := 0
	if files, _ := filepath.Glob(filepath.Join(p.runDir, "postgres-*", "data", "postmaster.pid")); len(files) > 0 {
		pg = pidFile(files[0])
	}
	return append(out,
		account{"postgres", pg, true},
		account{"redis", childWith(procs, p.proc, self, "redis-server", ""), true},
		account{"loadgen", self, false})
}

// watch starts the phase's profiles and CPU reading; the function it
// returns, called with the orders completed when the phase ends, reads
// the CPU and PostgreSQL's statements again, waits for the fetches (each
// bounded by its timeout) and records the phase.
func (p *profiler) watch(ctx context.Context, config string, hosts []*chaos.Host, d time.Duration) func(orders int) {
	rec := phaseRecord{config: config, machine: -1}
	if p.pg != nil {
		if err := p.pg.reset(ctx); err != nil {
			rec.errs = append(rec.errs, fmt.Sprintf("pg_stat_statements reset: %v", err))
		}
	}
	before := readProcs(p.proc)
	accts := p.accounts(before, hosts)
	machine0, machineOK := machineTicks(filepath.Join(p.proc, "stat"))
	start := time.Now()

	secs := max(int((d-profileMargin)/time.Second), 1)
	slug := configSlug(config)
	var mu sync.Mutex
	var wg sync.WaitGroup
	get := func(h *chaos.Host, kind, query string, timeout time.Duration) {
		defer wg.Done()
		name := fmt.Sprintf("%s-host%d-%s", slug, h.Index, kind)
		url := "http://" + h.Addr + "/debug/pprof/" + query
		switch {
		case strings.HasPrefix(kind, "metrics"):
			name, url = name+".txt", "http://"+h.Addr+"/metrics"
		case kind == "goroutines":
			name += ".txt"
		default:
			name += ".pb.gz"
		}
		path := filepath.Join(p.dir, name)
		err := p.fetch(ctx, url, path, timeout)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			rec.errs = append(rec.errs, fmt.Sprintf("host%d %s: %v", h.Index, kind, err))
			return
		}
		rec.files = append(rec.files, savedProfile{host: h.Index, kind: kind, path: path})
	}
	long := time.Duration(secs)*time.Second + fetchSlack
	for _, h := range hosts {
		// The metrics at the phase's start, here, and at its end, in the
		// function returned: their difference is what the phase did
		// (instances made and discarded, pool waits, advances heard).
		wg.Add(1)
		get(h, "metrics-start", "", fetchSlack)
		wg.Add(5)
		go get(h, "cpu", fmt.Sprintf("profile?seconds=%d", secs), long)
		// seconds=N on a named profile answers the delta over those
		// seconds (net/http/pprof, Go 1.16 on).
		go get(h, "block", fmt.Sprintf("block?seconds=%d", secs), long)
		go get(h, "mutex", fmt.Sprintf("mutex?seconds=%d", secs), long)
		// What the phase allocated, by where: what drives the garbage
		// collector.
		go get(h, "allocs", fmt.Sprintf("allocs?seconds=%d", secs), long)
		go func() {
			select {
			case <-time.After(d / 2):
				get(h, "goroutines", "goroutine?debug=1", fetchSlack)
			case <-ctx.Done():
				wg.Done()
			}
		}()
	}
	return func(orders int) {
		after := readProcs(p.proc)
		for _, h := range hosts {
			wg.Add(1)
			go get(h, "metrics-end", "", fetchSlack)
		}
		rec.orders = orders
		if p.pg != nil {
			var err error
			if rec.statements, rec.topStatements, err = p.pg.read(ctx); err != nil {
				rec.errs = append(rec.errs, fmt.Sprintf("pg_stat_statements: %v", err))
			}
		}
		rec.wall = time.Since(start)
		if m1, ok := machineTicks(filepath.Join(p.proc, "stat")); ok && machineOK {
			rec.machine = ticksDuration(m1 - machine0)
		}
		for _, a := range accts {
			used := time.Duration(-1)
			t0, ok0 := treeTicks(before, a.pid, a.tree)
			t1, ok1 := treeTicks(after, a.pid, a.tree)
			if a.pid > 0 && ok0 && ok1 {
				used = ticksDuration(t1 - t0)
			}
			rec.cpu = append(rec.cpu, procCPU{a.name, used})
		}
		wg.Wait()
		p.mu.Lock()
		p.records = append(p.records, rec)
		p.mu.Unlock()
	}
}

func ticksDuration(t int64) time.Duration { return time.Duration(t) * time.Second / clockTicks }

// fetch saves url's answer to path, within timeout.
func (p *profiler) fetch(ctx context.Context, url, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := p.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return f.Close()
}

// configSlug names a configuration in file names: "1 host(s)" → "1hosts",
// "floor+lock" → "floor-lock".
func configSlug(config string) string {
	return strings.NewReplacer(" host(s)", "hosts", " ", "-", "+", "-", "(", "", ")", "", "/", "-", "[", "", "]", "", "=", "-", `"`, "").Replace(config)
}

// keepOrders writes the half-load orders of row to {config}-orders.csv:
// when each was accepted, published and read (Unix ns; published 0 when
// the outbox did not say), its event's global position and whether it
// was its key's first: the tail's orders in time, to set beside a host's
// log (GODEBUG=gctrace=1 puts its collections there).
func (p *profiler) keepOrders(row Row, note func(string, ...any)) {
	var b strings.Builder
	b.WriteString("accepted_ns,published_ns,read_ns,global_position,new_key\n")
	for _, o := range row.halfOrders {
		var pub int64
		if at, ok := row.published[o.gp]; ok {
			pub = at.UnixNano()
		}
		fmt.Fprintf(&b, "%d,%d,%d,%d,%t\n", o.accepted.UnixNano(), pub, o.read.UnixNano(), o.gp, o.newKey)
	}
	path := filepath.Join(p.dir, configSlug(row.Name)+"-orders.csv")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		note("%s: orders not saved: %v", row.Name, err)
	}
}

// keepLog copies a host's log (from, in the run's directory, which goes
// at the end) to name in the profile directory.
func (p *profiler) keepLog(name, from string, note func(string, ...any)) {
	b, err := os.ReadFile(from)
	if err == nil {
		err = os.WriteFile(filepath.Join(p.dir, name), b, 0o644)
	}
	if err != nil {
		note("host log %s not saved: %v", name, err)
	}
}
