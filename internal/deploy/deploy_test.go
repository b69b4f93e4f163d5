package deploy_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/deploy"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/testlog"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

var loader *host.Loader

func TestMain(m *testing.M) {
	code := m.Run()
	if loader != nil {
		_ = loader.Close(context.Background())
	}
	wasmbuild.Cleanup()
	os.Exit(code)
}

func sharedLoader(t *testing.T) *host.Loader {
	t.Helper()
	if loader == nil {
		lim := host.Limits{Timeout: testwait.Limit(), ManifestTimeout: testwait.Limit(), CompileTimeout: testwait.Limit()}
		l, err := host.NewLoader(host.LoaderOptions{Limits: lim, CacheDir: wasmbuild.CacheDir(t),
			Tenancy: host.Tenancy{Of: tenantOf}})
		require.NoError(t, err)
		loader = l
	}
	return loader
}

// tenantOf: pm is acme's, every other module the default tenant's.
func tenantOf(module string) string {
	if module == "pm" {
		return "acme"
	}
	return ""
}

var broker = host.Broker{Name: "default", Provider: "inline"}

// module reads the bytes of a declared test module.
func module(t *testing.T, variant string) []byte {
	t.Helper()
	b, err := os.ReadFile(wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", "variant="+variant))
	require.NoError(t, err)
	return b
}

// version is b with a custom section holding n: the same module, other
// bytes (another SHA-256), as a rebuild would be.
func version(b []byte, n byte) []byte {
	body := append([]byte{7}, "version"...)
	return append(bytes.Clone(b), wasmbuild.Section(0, append(body, n))...)
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// fixture is a plugins directory served by a reloader, its deployer and
// its audit log.
type fixture struct {
	dir   string
	d     *deploy.Deployer
	audit *audit.Memory
	logs  *testlog.Buffer

	mu      sync.Mutex
	running *host.Set
	applied int
}

// newFixture starts with projector.wasm (v1 of the projector) running.
func newFixture(t *testing.T, opts deploy.Options) (*fixture, []byte) {
	t.Helper()
	ctx := context.Background()
	f := &fixture{dir: t.TempDir(), audit: audit.NewMemory(nil), logs: &testlog.Buffer{}}
	v1 := module(t, "projector")
	require.NoError(t, os.WriteFile(filepath.Join(f.dir, "projector.wasm"), v1, 0o644))
	l := sharedLoader(t)
	set, errs := host.LoadSet(ctx, l, f.dir, broker)
	require.Empty(t, errs)
	f.running = set
	r := host.NewReloader(host.ReloaderOptions{Loader: l, Dir: f.dir, Broker: broker, Running: set,
		Apply: func(s *host.Set) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.running, f.applied = s, f.applied+1
		}})
	t.Cleanup(func() { _ = f.set().Close(context.Background()) })
	opts.Dir, opts.Reload, opts.TenantOf = f.dir, r.Reload, tenantOf
	if opts.Audit == nil {
		opts.Audit = f.audit
	}
	opts.Logger = slog.New(slog.NewTextHandler(f.logs, nil))
	f.d = deploy.New(opts)
	return f, v1
}

func (f *fixture) set() *host.Set {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.running
}

// runningSHA is the SHA-256 of the running module of file, "" if none.
func (f *fixture) runningSHA(file string) string {
	for _, m := range f.set().Modules() {
		if m.File == file {
			return m.SHA256
		}
	}
	return ""
}

func (f *fixture) file(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.dir, name+".wasm"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	require.NoError(t, err)
	return b
}

// entries returns the audit log, oldest first.
func (f *fixture) entries(t *testing.T) []audit.Entry {
	t.Helper()
	es, err := f.audit.List(context.Background(), audit.Query{Limit: audit.MaxLimit})
	require.NoError(t, err)
	for i, j := 0, len(es)-1; i < j; i, j = i+1, j-1 {
		es[i], es[j] = es[j], es[i]
	}
	return es
}

// requireOneEntry checks that the action since before left one audit
// entry, and returns it.
func (f *fixture) requireOneEntry(t *testing.T, before int, action, tenant, target string, err error) audit.Entry {
	t.Helper()
	es := f.entries(t)
	require.Len(t, es, before+1, "one audit entry per action")
	e := es[before]
	require.Equal(t, audit.Entry{ID: e.ID, At: e.At, Principal: "key:test", Tenant: tenant, Action: action,
		Target: target, Outcome: audit.Outcome(err)}, e)
	return e
}

func (f *fixture) list(t *testing.T, tenants []string) map[string]deploy.ModuleInfo {
	t.Helper()
	infos, err := f.d.List(context.Background(), tenants)
	require.NoError(t, err)
	out := map[string]deploy.ModuleInfo{}
	for _, i := range infos {
		out[i.Name] = i
	}
	return out
}

func TestPutANewModuleIsAppliedAndListed(t *testing.T) {
	f, v1 := newFixture(t, deploy.Options{})
	pm := module(t, "pm")
	res, err := f.d.Put(context.Background(), "key:test", "pm", bytes.NewReader(pm))
	require.NoError(t, err)
	require.Equal(t, deploy.Result{Name: "pm", Tenant: "acme", SHA256: digest(pm), Size: int64(len(pm)), Outcome: host.Applied}, res)
	require.Equal(t, digest(pm), f.runningSHA("pm.wasm"), "the new module runs")
	f.requireOneEntry(t, 0, deploy.ActionPut, "acme", "pm sha256:"+digest(pm)[:12], nil)

	all := f.list(t, nil)
	require.Len(t, all, 2)
	require.Equal(t, "acme", all["pm"].Tenant)
	require.Equal(t, digest(pm), all["pm"].SHA256)
	require.Equal(t, int64(len(pm)), all["pm"].Size)
	require.False(t, all["pm"].Modified.IsZero())
	require.Empty(t, all["pm"].History)
	require.Equal(t, host.DefaultTenant, all["projector"].Tenant)
	require.Equal(t, digest(v1), all["projector"].SHA256)
	acme := f.list(t, []string{"acme"})
	require.Len(t, acme, 1)
	require.Contains(t, acme, "pm")
	require.Empty(t, f.list(t, []string{}), "an empty tenant list selects nothing")

	// The same bytes again: unchanged, and no history of a version that
	// did not change.
	res, err = f.d.Put(context.Background(), "key:test", "pm.wasm", bytes.NewReader(pm))
	require.NoError(t, err)
	require.Equal(t, host.Unchanged, res.Outcome)
	require.Equal(t, "pm", res.Name, "a .wasm suffix names the same module")
	require.Empty(t, f.list(t, nil)["pm"].History)
	f.requireOneEntry(t, 1, deploy.ActionPut, "acme", "pm sha256:"+digest(pm)[:12], nil)
}

func TestARejectedPutPutsThePreviousBytesBack(t *testing.T) {
	f, v1 := newFixture(t, deploy.Options{})
	ctx := context.Background()
	running := f.set()

	// Over an existing module: the bad bytes are refused, v1 is back byte
	// for byte, the running set was never replaced, history is as it was.
	junk := []byte("\x00asm not really")
	_, err := f.d.Put(ctx, "key:test", "projector", bytes.NewReader(junk))
	var rej *deploy.RejectedError
	require.ErrorAs(t, err, &rej)
	require.Equal(t, host.Rejected, rej.Outcome)
	require.Equal(t, "projector", rej.Module)
	require.NotEmpty(t, rej.Problems)
	require.Contains(t, rej.Problems[0].Error(), "projector.wasm")
	require.Equal(t, v1, f.file(t, "projector"), "the previous bytes, byte for byte")
	require.Same(t, running, f.set(), "the running set stays")
	require.Equal(t, 0, f.applied)
	require.Empty(t, f.list(t, nil)["projector"].History, "a refused version leaves no history")
	f.requireOneEntry(t, 0, deploy.ActionPut, host.DefaultTenant, "projector sha256:"+digest(junk)[:12], err)

	// A new module the set refuses (it re-keys category order): its file
	// is removed again.
	byOrder := module(t, "projector_by_order")
	_, err = f.d.Put(ctx, "key:test", "by_order", bytes.NewReader(byOrder))
	require.ErrorAs(t, err, &rej)
	require.Nil(t, f.file(t, "by_order"), "the new file is gone")
	require.Same(t, running, f.set())
	require.NotContains(t, f.list(t, nil), "by_order")
	f.requireOneEntry(t, 1, deploy.ActionPut, host.DefaultTenant, "by_order sha256:"+digest(byOrder)[:12], err)

	// The directory is valid again: a good deploy goes through.
	_, err = f.d.Put(ctx, "key:test", "projector", bytes.NewReader(version(v1, 2)))
	require.NoError(t, err)
	require.Equal(t, digest(version(v1, 2)), f.runningSHA("projector.wasm"))
}

func TestACanceledPutPutsThePreviousBytesBack(t *testing.T) {
	f, v1 := newFixture(t, deploy.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	v2 := version(v1, 2)
	_, err := f.d.Put(ctx, "key:test", "projector", bytes.NewReader(v2))
	var rej *deploy.RejectedError
	require.ErrorAs(t, err, &rej)
	require.Equal(t, host.Canceled, rej.Outcome)
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, v1, f.file(t, "projector"))
	require.Equal(t, digest(v1), f.runningSHA("projector.wasm"))
	f.requireOneEntry(t, 0, deploy.ActionPut, host.DefaultTenant, "projector sha256:"+digest(v2)[:12], err)
}

func TestRollbackPutsTheEarlierVersionBack(t *testing.T) {
	f, v1 := newFixture(t, deploy.Options{})
	ctx := context.Background()
	v2 := version(v1, 2)
	_, err := f.d.Put(ctx, "key:test", "projector", bytes.NewReader(v2))
	require.NoError(t, err)
	require.Equal(t, digest(v2), f.runningSHA("projector.wasm"))
	h := f.list(t, nil)["projector"].History
	require.Len(t, h, 1)
	require.Equal(t, digest(v1), h[0].SHA256)
	require.Equal(t, int64(len(v1)), h[0].Size)

	res, err := f.d.Rollback(ctx, "key:test", "projector")
	require.NoError(t, err)
	require.Equal(t, deploy.Result{Name: "projector", Tenant: host.DefaultTenant, SHA256: digest(v1), Size: int64(len(v1)), Outcome: host.Applied}, res)
	require.Equal(t, v1, f.file(t, "projector"))
	require.Equal(t, digest(v1), f.runningSHA("projector.wasm"))
	f.requireOneEntry(t, 1, deploy.ActionRollback, host.DefaultTenant, "projector sha256:"+digest(v1)[:12], nil)
	h = f.list(t, nil)["projector"].History
	require.Len(t, h, 1, "each version is kept once")
	require.Equal(t, digest(v2), h[0].SHA256)

	// A second rollback goes back to what the first replaced.
	res, err = f.d.Rollback(ctx, "key:test", "projector")
	require.NoError(t, err)
	require.Equal(t, digest(v2), res.SHA256)
	require.Equal(t, v2, f.file(t, "projector"))
}

func TestRollbackWithoutHistoryIsRefused(t *testing.T) {
	f, _ := newFixture(t, deploy.Options{})
	ctx := context.Background()
	_, err := f.d.Rollback(ctx, "key:test", "projector")
	require.ErrorIs(t, err, deploy.ErrNoHistory)
	f.requireOneEntry(t, 0, deploy.ActionRollback, host.DefaultTenant, "projector", err)
	_, err = f.d.Rollback(ctx, "key:test", "nothing")
	require.ErrorIs(t, err, deploy.ErrNoHistory)
	f.requireOneEntry(t, 1, deploy.ActionRollback, host.DefaultTenant, "nothing", err)
}

func TestARejectedRollbackKeepsTheCurrentVersion(t *testing.T) {
	f, v1 := newFixture(t, deploy.Options{})
	ctx := context.Background()
	// An earlier version the set no longer accepts: by_order's history
	// holds a module that re-keys category order.
	byOrder := module(t, "projector_by_order")
	hist := filepath.Join(f.dir, deploy.HistoryDir, "by_order")
	require.NoError(t, os.MkdirAll(hist, 0o750))
	kept := filepath.Join(hist, "1-"+digest(byOrder)[:12]+".wasm")
	require.NoError(t, os.WriteFile(kept, byOrder, 0o644))
	_, err := f.d.Rollback(ctx, "key:test", "by_order")
	var rej *deploy.RejectedError
	require.ErrorAs(t, err, &rej)
	require.Nil(t, f.file(t, "by_order"))
	require.FileExists(t, kept, "the refused version stays in history")
	require.Equal(t, v1, f.file(t, "projector"))
	f.requireOneEntry(t, 0, deploy.ActionRollback, host.DefaultTenant, "by_order sha256:"+digest(byOrder)[:12], err)
}

func TestRemoveTakesTheModuleAwayAndRollbackBringsItBack(t *testing.T) {
	f, _ := newFixture(t, deploy.Options{})
	ctx := context.Background()
	pm := module(t, "pm")
	_, err := f.d.Put(ctx, "key:test", "pm", bytes.NewReader(pm))
	require.NoError(t, err)

	res, err := f.d.Remove(ctx, "key:test", "pm")
	require.NoError(t, err)
	require.Equal(t, deploy.Result{Name: "pm", Tenant: "acme", Outcome: host.Applied}, res)
	require.Nil(t, f.file(t, "pm"))
	require.Empty(t, f.runningSHA("pm.wasm"), "the module no longer runs")
	f.requireOneEntry(t, 1, deploy.ActionRemove, "acme", "pm sha256:"+digest(pm)[:12], nil)
	info := f.list(t, nil)["pm"]
	require.Empty(t, info.SHA256, "a removed module is listed by its history")
	require.Len(t, info.History, 1)
	require.Equal(t, digest(pm), info.History[0].SHA256)

	res, err = f.d.Rollback(ctx, "key:test", "pm")
	require.NoError(t, err)
	require.Equal(t, digest(pm), res.SHA256)
	require.Equal(t, pm, f.file(t, "pm"))
	require.Equal(t, digest(pm), f.runningSHA("pm.wasm"))

	_, err = f.d.Remove(ctx, "key:test", "nothing")
	require.ErrorIs(t, err, deploy.ErrNotFound)
	f.requireOneEntry(t, 3, deploy.ActionRemove, host.DefaultTenant, "nothing", err)
}

// Removing the last module leaves a directory the loader refuses (no
// *.wasm files): the removal is refused and the module put back.
func TestARejectedRemovePutsTheModuleBack(t *testing.T) {
	f, v1 := newFixture(t, deploy.Options{})
	running := f.set()
	_, err := f.d.Remove(context.Background(), "key:test", "projector")
	var rej *deploy.RejectedError
	require.ErrorAs(t, err, &rej)
	require.Contains(t, err.Error(), "no *.wasm files")
	require.Equal(t, v1, f.file(t, "projector"))
	require.Same(t, running, f.set())
	require.Empty(t, f.list(t, nil)["projector"].History)
	f.requireOneEntry(t, 0, deploy.ActionRemove, host.DefaultTenant, "projector sha256:"+digest(v1)[:12], err)
}

func TestHistoryIsPrunedToKeep(t *testing.T) {
	now := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
	f, v1 := newFixture(t, deploy.Options{Keep: 2, Now: func() time.Time { return now }})
	ctx := context.Background()
	for n := byte(2); n <= 5; n++ {
		_, err := f.d.Put(ctx, "key:test", "projector", bytes.NewReader(version(v1, n)))
		require.NoError(t, err)
	}
	h := f.list(t, nil)["projector"].History
	require.Len(t, h, 2)
	require.Equal(t, digest(version(v1, 4)), h[0].SHA256, "newest first")
	require.Equal(t, digest(version(v1, 3)), h[1].SHA256)
	require.True(t, h[0].At.After(h[1].At), "versions kept within one tick of the clock stay in order")
	require.Equal(t, now, h[1].At.Truncate(time.Second))
	entries, err := os.ReadDir(filepath.Join(f.dir, deploy.HistoryDir, "projector"))
	require.NoError(t, err)
	require.Len(t, entries, 2, "no temporary file left behind")
	require.Len(t, f.entries(t), 4)
}

// The history directory is not read by the loader (a junk *.wasm in it
// loads nothing) nor watched (writing it starts no reload).
func TestHistoryIsIgnoredByTheLoaderAndTheWatcher(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	v1 := module(t, "projector")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "projector.wasm"), v1, 0o644))
	l := sharedLoader(t)
	set, errs := host.LoadSet(ctx, l, dir, broker)
	require.Empty(t, errs)
	afters := make(chan struct{}, 16)
	applied := make(chan *host.Set, 4)
	r := host.NewReloader(host.ReloaderOptions{Loader: l, Dir: dir, Broker: broker, Running: set, Quiet: time.Millisecond,
		Apply: func(s *host.Set) { applied <- s },
		Clock: clock.Funcs{AfterFunc: func(d time.Duration) <-chan time.Time { afters <- struct{}{}; return time.After(d) }}})
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { require.NoError(t, r.Stop(context.Background())) })

	hist := filepath.Join(dir, deploy.HistoryDir, "projector")
	require.NoError(t, os.MkdirAll(hist, 0o750))
	require.NoError(t, os.WriteFile(filepath.Join(hist, "1-abc.wasm"), []byte("junk"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, deploy.HistoryDir, "junk.wasm"), []byte("junk"), 0o644))

	// A change the watcher does see, after those: one wait, one reload.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pm.tmp"), module(t, "pm"), 0o644))
	require.NoError(t, os.Rename(filepath.Join(dir, "pm.tmp"), filepath.Join(dir, "pm.wasm")))
	next := testwait.Recv(t, "the reload of pm.wasm", applied)
	t.Cleanup(func() { _ = next.Close(context.Background()) })
	require.Len(t, next.Modules(), 2, "the history's files are not loaded")
	require.Len(t, afters, 1, "only pm.wasm started a wait")

	loaded, errs := host.LoadSet(ctx, l, dir, broker)
	require.Empty(t, errs, "LoadSet reads no file of the history")
	require.Len(t, loaded.Modules(), 2)
	require.NoError(t, loaded.Close(ctx))
}

func TestNamesThatAreNotAModuleFileAreRefused(t *testing.T) {
	f, v1 := newFixture(t, deploy.Options{})
	ctx := context.Background()
	long := strings.Repeat("a", 129)
	for _, name := range []string{"", "../x", ".x", "a/b", `a\b`, "/etc/passwd", "-x", ".history", "x y", "x\x00", long, ".wasm"} {
		t.Run(name, func(t *testing.T) {
			before := len(f.entries(t))
			_, err := f.d.Put(ctx, "key:test", name, bytes.NewReader(v1))
			require.ErrorIs(t, err, deploy.ErrInvalidName)
			_, err = f.d.Remove(ctx, "key:test", name)
			require.ErrorIs(t, err, deploy.ErrInvalidName)
			_, err = f.d.Rollback(ctx, "key:test", name)
			require.ErrorIs(t, err, deploy.ErrInvalidName)
			es := f.entries(t)[before:]
			require.Len(t, es, 3)
			for _, e := range es {
				require.Empty(t, e.Tenant, "an invalid name has no tenant")
				require.Contains(t, e.Outcome, "invalid module name")
			}
		})
	}
	entries, err := os.ReadDir(f.dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "nothing was written")
	require.Equal(t, 0, f.applied)
	for _, ok := range []string{"a", "orders_v2", "A-1.b", strings.Repeat("a", 128)} {
		_, err := deploy.CheckName(ok)
		require.NoError(t, err, ok)
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

func TestABodyTooLargeOrUnreadableIsRefused(t *testing.T) {
	f, v1 := newFixture(t, deploy.Options{MaxModuleBytes: 64})
	ctx := context.Background()
	require.Equal(t, int64(64), f.d.MaxModuleBytes())
	_, err := f.d.Put(ctx, "key:test", "projector", bytes.NewReader(make([]byte, 65)))
	require.ErrorIs(t, err, deploy.ErrTooLarge)
	f.requireOneEntry(t, 0, deploy.ActionPut, host.DefaultTenant, "projector", err)
	require.Equal(t, v1, f.file(t, "projector"))

	// At the bound: read, and refused by the reload instead.
	_, err = f.d.Put(ctx, "key:test", "projector", bytes.NewReader(make([]byte, 64)))
	var rej *deploy.RejectedError
	require.ErrorAs(t, err, &rej)

	_, err = f.d.Put(ctx, "key:test", "projector", io.MultiReader(strings.NewReader("\x00asm"), failingReader{}))
	require.ErrorContains(t, err, "connection reset")
	f.requireOneEntry(t, 2, deploy.ActionPut, host.DefaultTenant, "projector", err)
	require.Equal(t, v1, f.file(t, "projector"))
}

func TestAModuleThatIsNotARegularFileIsLeftAlone(t *testing.T) {
	f, v1 := newFixture(t, deploy.Options{})
	ctx := context.Background()
	require.NoError(t, os.Symlink("projector.wasm", filepath.Join(f.dir, "link.wasm")))
	_, err := f.d.Put(ctx, "key:test", "link", bytes.NewReader(version(v1, 2)))
	require.ErrorIs(t, err, deploy.ErrNotRegular)
	_, err = f.d.Remove(ctx, "key:test", "link")
	require.ErrorIs(t, err, deploy.ErrNotRegular)
	_, err = f.d.Rollback(ctx, "key:test", "link")
	require.ErrorIs(t, err, deploy.ErrNotRegular)
	target, err := os.Readlink(filepath.Join(f.dir, "link.wasm"))
	require.NoError(t, err)
	require.Equal(t, "projector.wasm", target)
	require.Len(t, f.entries(t), 3)
}

type failingLog struct{}

func (failingLog) Append(context.Context, audit.Entry) (int64, error) {
	return 0, errors.New("database down")
}
func (failingLog) List(context.Context, audit.Query) ([]audit.Entry, error) { return nil, nil }

// An audit entry that cannot be written is logged; the deploy stands.
func TestAnAuditFailureIsLoggedAndTheDeployStands(t *testing.T) {
	f, v1 := newFixture(t, deploy.Options{Audit: failingLog{}})
	res, err := f.d.Put(context.Background(), "key:test", "projector", bytes.NewReader(version(v1, 2)))
	require.NoError(t, err)
	require.Equal(t, host.Applied, res.Outcome)
	require.Contains(t, f.logs.String(), `msg="deploy: audit entry not recorded" action=modules.put module=projector error="database down"`)
}

// Concurrent deploys are serialised: each reload sees one change, and
// every one is applied.
func TestConcurrentDeploysAreSerialised(t *testing.T) {
	f, v1 := newFixture(t, deploy.Options{Keep: 10})
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for n := byte(2); n <= 5; n++ {
		wg.Go(func() {
			_, err := f.d.Put(ctx, "key:test", "projector", bytes.NewReader(version(v1, n)))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, f.list(t, nil)["projector"].History, 4, "v1 and three of the four, each kept once")
	require.Equal(t, digest(f.file(t, "projector")), f.runningSHA("projector.wasm"))
}

// A put goes live while another file of the directory is bad: the reload
// applies it in part (host.Partial), holding the bad file back, and the
// put stands. A put of bad bytes beside it is still refused and undone.
func TestAPutStandsBesideABadFile(t *testing.T) {
	f, v1 := newFixture(t, deploy.Options{})
	ctx := context.Background()
	require.NoError(t, os.WriteFile(filepath.Join(f.dir, "junk.wasm"), []byte("junk"), 0o644))

	pm := module(t, "pm")
	res, err := f.d.Put(ctx, "key:test", "pm", bytes.NewReader(pm))
	require.NoError(t, err)
	require.Equal(t, host.Partial, res.Outcome)
	require.Equal(t, pm, f.file(t, "pm"))
	require.Equal(t, digest(pm), f.runningSHA("pm.wasm"), "pm runs")

	_, err = f.d.Put(ctx, "key:test", "projector", bytes.NewReader([]byte("\x00asm not really")))
	var rej *deploy.RejectedError
	require.ErrorAs(t, err, &rej)
	require.Equal(t, v1, f.file(t, "projector"), "the previous bytes, byte for byte")
}
