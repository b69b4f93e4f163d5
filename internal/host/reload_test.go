package host_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/testlog"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// replace puts src at dir/name by an atomic rename, as a deploy would.
func replace(t *testing.T, src, dir, name string) {
	t.Helper()
	tmp := wasmbuild.Copy(t, src, dir, name+".tmp")
	require.NoError(t, os.Rename(tmp, filepath.Join(dir, name)))
}

// A reload says what it did (per changed module its file, old and new
// version and digest, and the time taken; "unchanged"; "valid again"),
// keeps it for Status, and carries unchanged modules into the new set as
// they run: the old set's close leaves them working.
func TestReloadTells(t *testing.T) {
	ctx := context.Background()
	l := sharedLoader(t)
	dir := t.TempDir()
	v1 := wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", "variant=projector", "version=1.0.0")
	v2 := wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", "variant=projector", "version=2.0.0")
	wasmbuild.Copy(t, v1, dir, "projector.wasm")
	wasmbuild.Copy(t, declared(t, "pm"), dir, "pm.wasm")
	running, errs := host.LoadSet(ctx, l, dir, host.Broker{Name: "default", Provider: "inline"})
	require.Empty(t, errs)
	logs := &testlog.Buffer{}
	applied := make(chan *host.Set, 1)
	r := host.NewReloader(host.ReloaderOptions{Loader: l, Dir: dir, Broker: host.Broker{Name: "default", Provider: "inline"},
		Running: running, Apply: func(s *host.Set) { applied <- s }, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.Nil(t, r.Status())

	out, _ := r.Reload(ctx)
	require.Equal(t, host.Unchanged, out)
	require.Contains(t, logs.Take(), `msg="plugins unchanged"`)

	replace(t, v2, dir, "projector.wasm")
	out, errs = r.Reload(ctx)
	require.Equal(t, host.Applied, out, "%v", errs)
	next := <-applied
	log := logs.Take()
	old, now := module(running, "projector.wasm"), module(next, "projector.wasm")
	require.Contains(t, log, `msg="plugin changed" file=projector.wasm module=projector old_version=1.0.0 new_version=2.0.0 old_sha256=`+old.SHA256+` new_sha256=`+now.SHA256)
	require.Regexp(t, `msg="plugins reloaded" dir=\S+ modules=2 changed=1 took=\S+`, log)
	st := r.Status()
	require.Equal(t, host.Applied, st.Outcome)
	require.Equal(t, []host.ModuleChange{{File: "projector.wasm",
		Old: host.ModuleVersion{Name: "projector", Version: "1.0.0", SHA256: old.SHA256},
		New: host.ModuleVersion{Name: "projector", Version: "2.0.0", SHA256: now.SHA256}}}, st.Changes)
	require.Positive(t, st.Took)

	// The unchanged module was carried, not loaded again, and outlives
	// the set it came from.
	require.Same(t, module(running, "pm.wasm"), module(next, "pm.wasm"))
	require.NoError(t, running.Close(ctx))
	pm := module(next, "pm.wasm")
	res, err := pm.Handle(ctx, "fulfillment", []abi.Envelope{{ID: "m-1", Type: "PaymentRecorded", Stream: "payment-p-1",
		Data: json.RawMessage(`{"payment_id":"p-1","order_id":"o-1"}`)}}, nil)
	require.NoError(t, err, "the carried module still runs after the old set closed")
	require.Len(t, res, 1)

	// A bad file: rejected, named; its removal makes the directory valid
	// again.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "junk.wasm"), []byte("junk"), 0o644))
	out, _ = r.Reload(ctx)
	require.Equal(t, host.Rejected, out)
	require.Contains(t, logs.Take(), "file=junk.wasm")
	st = r.Status()
	require.Len(t, st.Problems, 1)
	require.Equal(t, "junk.wasm", st.Problems[0].File)
	require.Contains(t, st.Problems[0].Error, "not a WebAssembly module")
	require.NoError(t, os.Remove(filepath.Join(dir, "junk.wasm")))
	out, _ = r.Reload(ctx)
	require.Equal(t, host.Unchanged, out)
	log = logs.Take()
	require.Contains(t, log, `msg="plugins unchanged"`)
	require.Contains(t, log, `msg="plugins directory valid again"`)
	require.NoError(t, next.Close(ctx))
}

func module(s *host.Set, file string) *host.Module {
	for _, m := range s.Modules() {
		if m.File == file {
			return m
		}
	}
	return nil
}

// A reload that changes the partition key of a running category is
// rejected (rule repartition), naming the category, both keys and the
// file, and the running set stays; with AllowRepartition it is applied
// and logged as a re-partition. A category new to the set, or one that
// leaves it, is no re-partition.
func TestReloadRefusesARepartitionUnlessAllowed(t *testing.T) {
	ctx := context.Background()
	l := sharedLoader(t)
	for _, allow := range []bool{false, true} {
		dir := t.TempDir()
		wasmbuild.Copy(t, declared(t, "projector"), dir, "projector.wasm")
		running, errs := host.LoadSet(ctx, l, dir, host.Broker{Name: "default", Provider: "inline"})
		require.Empty(t, errs)
		logs := &testlog.Buffer{}
		applied := make(chan *host.Set, 2)
		r := host.NewReloader(host.ReloaderOptions{Loader: l, Dir: dir, Broker: host.Broker{Name: "default", Provider: "inline"},
			Running: running, Apply: func(s *host.Set) { applied <- s }, Logger: slog.New(slog.NewTextHandler(logs, nil)), AllowRepartition: allow})

		// A new category (payment, shipping) is no re-partition.
		wasmbuild.Copy(t, declared(t, "pm"), dir, "pm.wasm")
		out, errs := r.Reload(ctx)
		require.Equal(t, host.Applied, out, "%v", errs)
		<-applied

		// order goes from client_id to order_id.
		require.NoError(t, os.Remove(filepath.Join(dir, "projector.wasm")))
		replace(t, declared(t, "projector_by_order"), dir, "by_order.wasm")
		out, errs = r.Reload(ctx)
		if !allow {
			require.Equal(t, host.Rejected, out)
			require.Len(t, errs, 1)
			var p *host.Problem
			require.ErrorAs(t, errs[0], &p)
			require.Equal(t, host.RuleRepartition, p.Rule)
			require.Equal(t, "by_order.wasm", p.File)
			require.Contains(t, p.Error(), "category order would change its partition key from sequential_by client_id (handler by_client in projector.wasm) to sequential_by order_id (handler by_order in by_order.wasm) while it runs")
			require.Contains(t, p.Error(), "allow_repartition = true")
			require.Empty(t, applied, "the running set stays")
			require.Equal(t, host.Rejected, r.Status().Outcome)

			// The category leaving the set is no re-partition.
			require.NoError(t, os.Remove(filepath.Join(dir, "by_order.wasm")))
			out, errs = r.Reload(ctx)
			require.Equal(t, host.Applied, out, "%v", errs)
			continue
		}
		require.Equal(t, host.Applied, out, "%v", errs)
		next := <-applied
		key, ok := next.PartitionField("order")
		require.True(t, ok)
		require.Equal(t, "order_id", key)
		require.Contains(t, logs.Take(), `msg="plugin reload re-partitions a live category (allow_repartition is set)`)
	}
}

// fileSum is the SHA-256 of a file, as a module's SHA256 is.
func fileSum(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// One bad file does not hide a good edit of another module (issue 38):
// while pm.wasm holds bytes that do not load, an edit of projector.wasm
// goes live (Partial), pm keeps serving its running version, and pm.wasm
// is reported rejected, with its bytes' digest and the time they were
// first rejected, until a version of it loads.
func TestReloadABadFileDoesNotHideAGoodEdit(t *testing.T) {
	ctx := context.Background()
	l := sharedLoader(t)
	dir := t.TempDir()
	v1 := wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", "variant=projector", "version=1.0.0")
	v2 := wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", "variant=projector", "version=2.0.0")
	pm2 := wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", "variant=pm", "version=2.0.0")
	wasmbuild.Copy(t, v1, dir, "projector.wasm")
	wasmbuild.Copy(t, declared(t, "pm"), dir, "pm.wasm")
	running, errs := host.LoadSet(ctx, l, dir, inline)
	require.Empty(t, errs)
	t.Cleanup(func() { _ = running.Close(ctx) })
	logs := &testlog.Buffer{}
	applied := make(chan *host.Set, 2)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := clock.Funcs{NowFunc: func() time.Time { return now }}
	r := host.NewReloader(host.ReloaderOptions{Loader: l, Dir: dir, Broker: inline, Running: running,
		Apply: func(s *host.Set) { applied <- s }, Logger: slog.New(slog.NewTextHandler(logs, nil)), Clock: clk})

	// pm.wasm goes bad: nothing changes; pm.wasm is rejected.
	bad := filepath.Join(dir, "pm.wasm.tmp")
	require.NoError(t, os.WriteFile(bad, []byte("junk"), 0o644))
	require.NoError(t, os.Rename(bad, filepath.Join(dir, "pm.wasm")))
	badSum := fileSum(t, filepath.Join(dir, "pm.wasm"))
	out, errs := r.Reload(ctx)
	require.Equal(t, host.Rejected, out, "%v", errs)
	require.Empty(t, applied)
	firstAt := now
	require.Equal(t, []host.Rejection{{File: "pm.wasm", Tenant: host.DefaultTenant, SHA256: badSum, At: firstAt,
		Error: "pm.wasm: not a WebAssembly module: bad magic number"}}, r.Status().Rejected)

	// A good edit of projector.wasm goes live beside it.
	now = now.Add(time.Minute)
	replace(t, v2, dir, "projector.wasm")
	out, errs = r.Reload(ctx)
	require.Equal(t, host.Partial, out, "%v", errs)
	next := testwait.Recv(t, "the edit applied", applied)
	t.Cleanup(func() { _ = next.Close(ctx) })
	require.Equal(t, "2.0.0", module(next, "projector.wasm").Manifest.Module.Version)
	require.Same(t, module(running, "pm.wasm"), module(next, "pm.wasm"), "pm keeps its running version")
	st := r.Status()
	require.Len(t, st.Changes, 1)
	require.Equal(t, "projector.wasm", st.Changes[0].File)
	require.Equal(t, []host.FileProblem{{File: "pm.wasm", Error: "pm.wasm: not a WebAssembly module: bad magic number"}}, st.Problems)
	require.Equal(t, []host.Rejection{{File: "pm.wasm", Tenant: host.DefaultTenant, SHA256: badSum, At: firstAt,
		Error: "pm.wasm: not a WebAssembly module: bad magic number"}}, st.Rejected, "still rejected since its bytes were first seen")
	log := logs.Take()
	require.Contains(t, log, `msg="plugin changed" file=projector.wasm module=projector old_version=1.0.0 new_version=2.0.0`)
	require.Contains(t, log, `msg="plugin file rejected; its running version, if any, stays"`)
	require.Contains(t, log, "file=pm.wasm")

	// The running module survives the set it came from, and still runs.
	pm := module(next, "pm.wasm")
	res, err := pm.Handle(ctx, "fulfillment", []abi.Envelope{{ID: "m-1", Type: "PaymentRecorded", Stream: "payment-p-1",
		Data: json.RawMessage(`{"payment_id":"p-1","order_id":"o-1"}`)}}, nil)
	require.NoError(t, err)
	require.Len(t, res, 1)

	// A version of pm.wasm that loads clears the rejection.
	replace(t, pm2, dir, "pm.wasm")
	out, errs = r.Reload(ctx)
	require.Equal(t, host.Applied, out, "%v", errs)
	last := testwait.Recv(t, "the fixed file applied", applied)
	t.Cleanup(func() { _ = last.Close(ctx) })
	require.Equal(t, "2.0.0", module(last, "pm.wasm").Manifest.Module.Version)
	require.Empty(t, r.Status().Rejected)
	require.Contains(t, logs.Take(), `msg="plugins directory valid again"`)
}

// A new version that breaks the set with an unchanged module is held
// back: its file keeps its running version and is rejected with the set's
// problem, while another edit goes live. The problem names whichever of
// the two files comes second (here pm.wasm, edited too, when the ledger's
// file sorts first), so the edits are also tried one at a time.
func TestReloadHoldsBackAModuleThatBreaksTheSet(t *testing.T) {
	ctx := context.Background()
	l := sharedLoader(t)
	pm2 := wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", "variant=pm", "version=2.0.0")
	for _, ledger := range []string{"a_ledger.wasm", "z_ledger.wasm"} {
		t.Run(ledger, func(t *testing.T) {
			dir := t.TempDir()
			wasmbuild.Copy(t, declared(t, "unpartitioned_without_key"), dir, ledger)
			wasmbuild.Copy(t, declared(t, "pm"), dir, "pm.wasm")
			running, errs := host.LoadSet(ctx, l, dir, inline)
			require.Empty(t, errs)
			t.Cleanup(func() { _ = running.Close(ctx) })
			applied := make(chan *host.Set, 1)
			r := host.NewReloader(host.ReloaderOptions{Loader: l, Dir: dir, Broker: inline, Running: running,
				Apply: func(s *host.Set) { applied <- s }})

			// The ledger now partitions payment by payment_id, where pm
			// partitions it by order_id; pm gets a new version.
			replace(t, declared(t, "payment_by_id"), dir, ledger)
			replace(t, pm2, dir, "pm.wasm")
			out, errs := r.Reload(ctx)
			require.Equal(t, host.Partial, out, "%v", errs)
			next := testwait.Recv(t, "the set applied", applied)
			t.Cleanup(func() { _ = next.Close(ctx) })
			require.Same(t, module(running, ledger), module(next, ledger), "the ledger keeps its running version")
			require.Equal(t, "2.0.0", module(next, "pm.wasm").Manifest.Module.Version)
			st := r.Status()
			require.Len(t, st.Rejected, 1)
			require.Equal(t, ledger, st.Rejected[0].File)
			require.Equal(t, fileSum(t, filepath.Join(dir, ledger)), st.Rejected[0].SHA256)
			require.Contains(t, st.Rejected[0].Error, "stream category payment is partitioned by conflicting keys")
			require.Len(t, errs, 1)
			require.Equal(t, ledger, host.ProblemFile(errs[0]), "the problem is the held file's, whichever file it names")
			require.Equal(t, ledger, st.Problems[0].File)
			var p *host.Problem
			require.ErrorAs(t, errs[0], &p)
			require.Equal(t, host.RuleOneKey, p.Rule)

			// Taken back on disk: nothing is rejected any more.
			replace(t, declared(t, "unpartitioned_without_key"), dir, ledger)
			out, errs = r.Reload(ctx)
			require.Equal(t, host.Unchanged, out, "%v", errs)
			require.Empty(t, r.Status().Rejected)
		})
	}
}

// A start says how far it is, module by module (a cold compile of a Go
// module takes seconds, with nothing else logged meanwhile); a reload
// logs only the modules it loads, not those it carries over.
func TestLoadingLogsEachModuleLoaded(t *testing.T) {
	ctx := context.Background()
	logs := &testlog.Buffer{}
	l := newLoader(t, host.LoaderOptions{}, logs)
	dir := t.TempDir()
	wasmbuild.Copy(t, wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", "variant=projector", "version=1.0.0"), dir, "projector.wasm")
	wasmbuild.Copy(t, declared(t, "pm"), dir, "pm.wasm")
	running, errs := host.LoadSet(ctx, l, dir, host.Broker{Name: "default", Provider: "inline"})
	require.Empty(t, errs)
	t.Cleanup(func() { _ = running.Close(ctx) })
	start := logs.Take()
	require.Contains(t, start, `msg="loading plugins" dir=`+dir+` files=2`)
	require.Regexp(t, `msg="module loaded" file=pm.wasm of=[12]/2 took=\S+ version=\S+ sha256=[0-9a-f]{12}`, start)
	require.Regexp(t, `msg="module loaded" file=projector.wasm of=[12]/2 took=\S+ version=1.0.0 sha256=[0-9a-f]{12}`, start)

	replace(t, wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", "variant=projector", "version=2.0.0"), dir, "projector.wasm")
	r := host.NewReloader(host.ReloaderOptions{Loader: l, Dir: dir, Broker: host.Broker{Name: "default", Provider: "inline"},
		Running: running, Apply: func(s *host.Set) { t.Cleanup(func() { _ = s.Close(ctx) }) }, Logger: slog.New(slog.NewTextHandler(&testlog.Buffer{}, nil))})
	out, errs := r.Reload(ctx)
	require.Equal(t, host.Applied, out, "%v", errs)
	reload := logs.Take()
	require.NotContains(t, reload, "loading plugins")
	require.NotContains(t, reload, "file=pm.wasm", "pm.wasm is carried over, not loaded")
	require.Regexp(t, `msg="module loaded" file=projector.wasm of=[12]/2 took=\S+ version=2.0.0`, reload)
}
