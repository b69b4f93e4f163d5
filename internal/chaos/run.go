package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/proteanhq/protean-host/internal/faultproxy"
	"github.com/proteanhq/protean-host/internal/serverbin"
)

// reloadModule is the module a hot reload swaps: the projector the checks
// read, so a reload that loses or repeats a message shows.
const reloadModule = "client_orders.wasm"

// Options configure a run. Zero values take the defaults of [Run].
type Options struct {
	Seed    uint64
	Steps   int    // fault steps (default: every kind once, then 3 mixed steps)
	Kinds   []Kind // the kinds to draw from (default: all)
	Hosts   int    // host processes (default 3)
	Clients int    // load clients (default 6)
	Pace    time.Duration
	// LeaseTTL is the hosts' lease_ttl_ms (and outbox lock_timeout_ms):
	// default 3 s, so faults resolve quickly.
	LeaseTTL time.Duration
	// Settle bounds the convergence wait after the last fault (default
	// 120 s) and, separately, how long clients may take to have their
	// order in hand answered.
	Settle time.Duration
	// RedisOutage and PGOutage are how long redis-down and pg-down keep
	// the server down (default 60 s and 30 s).
	RedisOutage, PGOutage time.Duration

	Bin     string // the protean-host binary (make build)
	Plugins string // the example modules (make plugins)
	// Variant is another build of client_orders.wasm, for the hot reload;
	// empty: Run builds one from Root with a different version.
	Variant string
	Root    string // the repository (configs/production.toml, plugins/examples)
	WorkDir string // where the run's directory goes (default: the system's temp dir)
	Keep    bool   // keep the run's directory even when the run passed

	Out io.Writer // progress and the report (default os.Stdout)
}

func (o *Options) defaults() {
	if len(o.Kinds) == 0 {
		o.Kinds = Kinds
	}
	if o.Steps <= 0 {
		o.Steps = len(o.Kinds) + 3
	}
	if o.Hosts <= 0 {
		o.Hosts = 3
	}
	if o.Clients <= 0 {
		o.Clients = 6
	}
	if o.Pace == 0 {
		o.Pace = 20 * time.Millisecond
	}
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = 3 * time.Second
	}
	if o.Settle <= 0 {
		o.Settle = 120 * time.Second
	}
	if o.RedisOutage <= 0 {
		o.RedisOutage = 60 * time.Second
	}
	if o.PGOutage <= 0 {
		o.PGOutage = 30 * time.Second
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
}

// StepResult is one step as it ran.
type StepResult struct {
	Step  Step
	Start time.Duration // since the load started
	Took  time.Duration
	Err   error
}

// Report is a run's schedule, what ran, and what the checks found.
type Report struct {
	Seed    uint64
	Steps   []StepResult
	Outcome Outcome
	// Errors are the harness's own failures: a fault it could not undo, a
	// server or host that did not come back. They fail the run too.
	Errors  []string
	WorkDir string
	Halts   string // `protean-host partitions list`, its summary
	// Laggards are the orders that reached their projection last.
	Laggards []Laggard
}

// Failed reports whether any check or the harness failed.
func (r *Report) Failed() bool { return len(r.Errors) > 0 || len(r.Outcome.Violations()) > 0 }

type runner struct {
	o            Options
	start        time.Time
	pg           *Postgres
	redis        *Redis
	pgProxies    []*faultproxy.Proxy
	redisProxies []*faultproxy.Proxy
	hosts        []*Host

	variant, variantVersion, baseVersion string
	reloads                              int

	halts   map[string]int       // halt records seen after a step -> that step
	arrived map[string]time.Time // orders missing at convergence's first look -> first seen projected

	outMu sync.Mutex
	rr    int
}

func (r *runner) notef(format string, args ...any) {
	r.outMu.Lock()
	defer r.outMu.Unlock()
	fmt.Fprintf(r.o.Out, "%7.1fs  %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

// Run starts PostgreSQL, Redis, a proxy pair per host and the hosts,
// puts load on them, injects the seed's schedule of faults, waits for the
// projections to converge, checks, prints the report, and stops every
// process it started, on every path (ctx canceled too). The error is
// the harness's own (it could not set up); violations are in the Report.
func Run(ctx context.Context, o Options) (rep *Report, err error) {
	o.defaults()
	r := &runner{o: o, start: time.Now()}
	rep = &Report{Seed: o.Seed}
	parent := o.WorkDir
	if parent == "" {
		parent = os.TempDir()
	}
	dir, err := os.MkdirTemp(parent, "protean-chaos-")
	if err != nil {
		return nil, err
	}
	// Readable by the postgres user, which runs PostgreSQL in a subdirectory.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	rep.WorkDir = dir
	var load *Load
	defer func() {
		if load != nil {
			load.Stop(time.Second)
		}
		failed := err != nil || rep.Failed()
		r.teardown(failed || o.Keep)
		if failed || o.Keep {
			fmt.Fprintf(o.Out, "logs kept in %s (host-*/host.log, postgres-*/postgres.log, redis-*/redis.log)\n", dir)
		} else {
			_ = os.RemoveAll(dir)
		}
	}()

	if err := r.setup(ctx, dir); err != nil {
		return rep, err
	}
	plan := Plan(o.Seed, o.Steps, o.Hosts, o.LeaseTTL, o.Kinds)
	outages(plan, o.RedisOutage, o.PGOutage)
	addrs := make([]string, len(r.hosts))
	for i, h := range r.hosts {
		addrs[i] = h.Addr
	}
	load = StartLoad(ctx, o.Seed, o.Clients, addrs, o.Pace)
	if err := until(ctx, serverBound, "the load's first orders accepted", func() (bool, string) {
		n := load.Accepted()
		return n >= o.Clients, fmt.Sprintf("%d accepted", n)
	}); err != nil {
		return rep, err
	}
	r.notef("load running: %d clients over %d hosts; %d steps from seed %d", o.Clients, o.Hosts, len(plan), o.Seed)
	var lastFault time.Time
	for i, st := range plan {
		hold(ctx, st.Gap)
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		res := r.step(ctx, i, st)
		rep.Steps = append(rep.Steps, res)
		lastFault = time.Now()
		r.sampleHalts(ctx, i+1)
		if res.Err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("step %d: %v", i+1, res.Err))
			break
		}
		if err := r.revive(ctx); err != nil {
			rep.Errors = append(rep.Errors, fmt.Sprintf("after step %d: %v", i+1, err))
			break
		}
	}
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	r.notef("last fault over; %d orders accepted; stopping the load (each client finishes its order in hand)", load.Accepted())
	load.Stop(o.Settle)
	answered := time.Now()
	clients := load.snapshots()
	ok, at := r.converge(ctx, clients, o.Settle)
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}
	out, err := r.check(ctx, clients)
	if err != nil {
		rep.Errors = append(rep.Errors, "checks: "+err.Error())
		rep.Outcome = out
		rep.Print(o.Out)
		return rep, nil
	}
	out.Halted = len(out.haltKeys)
	for k, step := range r.halts {
		if !slices.Contains(out.haltKeys, k) {
			out.Halted++
			out.Details = append(out.Details, fmt.Sprintf("halt record seen after step %d, gone at the end (Redis lost it): %s", step, k))
		}
	}
	out.Complete = ok
	out.CompleteAfter = at.Sub(lastFault)
	out.AnsweredAfter, out.CompleteAfterAnswered = answered.Sub(lastFault), at.Sub(answered)
	rep.Outcome = out
	rep.Halts = r.cli(ctx, "partitions", "list")
	laggards, lerr := r.laggards(ctx, lastFault, 5)
	if lerr != nil {
		rep.Errors = append(rep.Errors, "laggards: "+lerr.Error())
	}
	rep.Laggards = laggards
	rep.Print(o.Out)
	if out.Abandoned > 0 {
		fmt.Fprintln(o.Out, "\n$ protean-host outbox status")
		fmt.Fprintln(o.Out, r.cli(ctx, "outbox", "status"))
	}
	return rep, nil
}

// sampleHalts records the halt records present now: a later Redis
// restarted empty would erase them, and the end's check miss them.
func (r *runner) sampleHalts(ctx context.Context, step int) {
	keys, err := r.haltKeys(ctx)
	if err != nil {
		return
	}
	if r.halts == nil {
		r.halts = map[string]int{}
	}
	for _, k := range keys {
		if _, ok := r.halts[k]; !ok {
			r.halts[k] = step
		}
	}
}

func (r *runner) step(ctx context.Context, i int, st Step) StepResult {
	res := StepResult{Step: st, Start: time.Since(r.start)}
	names := ""
	for j, f := range st.Faults {
		if j > 0 {
			names += " + "
		}
		names += f.String()
	}
	r.notef("step %d: %s", i+1, names)
	t0 := time.Now()
	errs := make([]error, len(st.Faults))
	var wg sync.WaitGroup
	for j, f := range st.Faults {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.do(ctx, f); err != nil {
				errs[j] = fmt.Errorf("%s: %w", f.Kind, err)
			}
		}()
	}
	wg.Wait()
	res.Took = time.Since(t0)
	res.Err = errors.Join(errs...)
	r.notef("step %d over in %.1fs%s", i+1, res.Took.Seconds(), errSuffix(res.Err))
	return res
}

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return ": " + err.Error()
}

// revive starts every host that is not running (one that exited on its
// own during the step; it was counted as a crash).
func (r *runner) revive(ctx context.Context) error {
	for _, h := range r.hosts {
		if !h.Alive() {
			r.notef("host %d is down; starting it", h.Index)
			if err := h.Start(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *runner) setup(ctx context.Context, dir string) error {
	o := r.o
	for _, p := range []string{o.Bin, o.Plugins} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%w (make build plugins)", err)
		}
	}
	base := filepath.Join(o.Root, "configs", "production.toml")
	var err error
	if r.baseVersion, err = moduleVersion(ctx, o.Bin, o.Root, filepath.Join(o.Plugins, reloadModule)); err != nil {
		return err
	}
	r.variant = o.Variant
	if r.variant == "" {
		r.variant = filepath.Join(dir, "variant", reloadModule)
		r.notef("building %s with another version for the hot reload", reloadModule)
		if err := buildVariant(ctx, o.Root, r.variant); err != nil {
			return err
		}
	}
	if r.variantVersion, err = moduleVersion(ctx, o.Bin, o.Root, r.variant); err != nil {
		return err
	}
	if r.variantVersion == r.baseVersion {
		return fmt.Errorf("the hot-reload variant %s has the version of %s (%s): a reload would not show", r.variant, o.Plugins, r.baseVersion)
	}
	if r.pg, err = StartPostgres(ctx, dir); err != nil {
		return err
	}
	if r.redis, err = StartRedis(ctx, dir); err != nil {
		return err
	}
	r.notef("PostgreSQL on %s, Redis on %s (appendonly yes, appendfsync always)", r.pg.Addr(), r.redis.Addr())
	cache := filepath.Join(dir, "wasm-cache")
	for i := 0; i < o.Hosts; i++ {
		pp, err := faultproxy.New(r.pg.Addr())
		if err != nil {
			return err
		}
		r.pgProxies = append(r.pgProxies, pp)
		rp, err := faultproxy.New(r.redis.Addr())
		if err != nil {
			return err
		}
		r.redisProxies = append(r.redisProxies, rp)
		port, err := serverbin.FreePort()
		if err != nil {
			return err
		}
		h, err := NewHost(i, dir, o.Bin, base, o.Plugins, HostConfig{
			DatabaseURL: URL(pp.Addr()), RedisURL: "redis://" + rp.Addr() + "/0",
			Listen: fmt.Sprintf("127.0.0.1:%d", port), CacheDir: cache, LeaseTTL: o.LeaseTTL,
		}, r.notef)
		if err != nil {
			return err
		}
		r.hosts = append(r.hosts, h)
	}
	if out := r.cli(ctx, "migrate"); !migrated(out) {
		return fmt.Errorf("migrate: %s", out)
	}
	for _, h := range r.hosts {
		if err := h.Start(ctx); err != nil {
			return err
		}
		r.notef("host %d up on %s (PostgreSQL via %s, Redis via %s)", h.Index, h.Addr, r.pgProxies[h.Index].Addr(), r.redisProxies[h.Index].Addr())
	}
	return nil
}

// migrated reads cli's output of migrate: cli appends the error.
func migrated(out string) bool { return !strings.Contains(out, "(migrate: ") }

// teardown stops what setup started, newest first. Hosts are killed:
// the checks are done, and a graceful stop would only cost time.
func (r *runner) teardown(keep bool) {
	for _, h := range r.hosts {
		_ = h.Kill()
	}
	for _, p := range append(r.pgProxies, r.redisProxies...) {
		_ = p.Close()
	}
	// On a failure the logs and Redis's AOF stay for a post-mortem;
	// PostgreSQL's data directory (tens of MB) goes, its log stays.
	r.redis.Stop(keep)
	r.pg.Stop(false)
}

// moduleVersion reads a module's version from `protean-host validate`
// on a directory holding that file alone.
func moduleVersion(ctx context.Context, bin, root, wasm string) (string, error) {
	dir, err := os.MkdirTemp("", "protean-chaos-validate-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	if err := copyFile(wasm, filepath.Join(dir, filepath.Base(wasm))); err != nil {
		return "", err
	}
	cctx, cancel := context.WithTimeout(ctx, serverBound)
	defer cancel()
	cmd := exec.CommandContext(cctx, bin, "validate", "--plugins", dir,
		"--config", filepath.Join(root, "configs", "domain.toml"))
	cmd.Env = hostEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("validate %s: %w\n%s", wasm, err, out)
	}
	return versionIn(string(out), filepath.Base(wasm))
}

// buildVariant builds plugins/examples/client_orders with another
// version (the reload benchmark's way: -X main.version).
func buildVariant(ctx context.Context, root, out string) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-buildmode=c-shared", "-ldflags", "-X main.version=1.0.1-chaos",
		"-o", out, "./plugins/examples/client_orders")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the hot-reload variant: %w\n%s", err, b)
	}
	return nil
}
