package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// stopBound is how far past its deadline a stopped guest may return in
// these tests. The mechanism's own bound is one timer wake-up plus the run
// to the guest's next loop header or call (microseconds, see host/doc.go);
// this is generous because the test machines are shared and loaded.
const stopBound = 3 * time.Second

// A guest looping without ever calling the host is stopped by its
// deadline, alone and four at once on two cores; the stopped instances are
// discarded and the next call works. The n calls run at once: the tenant
// may hold n slots (at its default max_concurrency of GOMAXPROCS, the
// calls past it queued for a slot with the same deadline as the running
// ones, and failed waiting whenever the running ones were stopped a
// moment after it), and those past GOMAXPROCS wait for a turn at the
// cores, which ends at their deadline too.
func TestDeadlineStopsPureGuestLoops(t *testing.T) {
	const timeout = 300 * time.Millisecond
	for _, n := range []int{1, 4} {
		l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{Timeout: timeout}), Instances: n, CacheDir: wasmbuild.CacheDir(t),
			GuestConcurrency: n, Shares: map[string]host.ShareOptions{host.DefaultTenant: {MaxConcurrency: n}}})
		require.NoError(t, err)
		m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"))
		require.NoError(t, err)
		require.Equal(t, host.DeadlineInstrumented, m.Deadline)
		type out struct {
			err  error
			took time.Duration
		}
		done := make(chan out, n)
		for range n {
			go func() {
				start := time.Now()
				_, err := m.Handle(context.Background(), "behave", ops("loop"), &memSession{})
				done <- out{err, time.Since(start)}
			}()
		}
		for range n {
			o := testwait.Recv(t, "a spinning call to return (the guest never does on its own)", done)
			require.ErrorIs(t, o.err, host.ErrTimeout, "%d spinning", n)
			require.Less(t, o.took, timeout+stopBound, "%d spinning: a guest ran %s past its %s deadline", n, o.took-timeout, timeout)
			t.Logf("%d spinning: stopped %s after the deadline", n, o.took-timeout)
		}
		// The next call gets a fresh instance. On a loaded machine that
		// call (its instantiation included) can itself outrun the short
		// deadline: a timeout is tried again, any other error fails.
		var res []abi.Result
		testwait.For(t, "the next call after stopped instances to succeed", func() (bool, string) {
			var err error
			res, err = m.Handle(context.Background(), "behave", ops("ok"), &memSession{})
			if errors.Is(err, host.ErrTimeout) {
				return false, err.Error()
			}
			require.NoError(t, err, "the next call after stopped instances")
			return true, ""
		})
		require.Len(t, res, 1)
		require.NoError(t, m.Close(context.Background()))
		require.NoError(t, l.Close(context.Background()))
	}
}

// startLoop is a module whose start section loops forever: wazero runs a
// start section inside instantiation, where no call deadline applies. It
// imports WASI's sched_yield as Go modules do; startLoopNoYield does not
// (the instrumentation adds the import and renumbers the functions).
var (
	startLoop = []byte{
		0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00,
		0x01, 0x08, 0x02, 0x60, 0x00, 0x00, 0x60, 0x00, 0x01, 0x7F, // types: [] -> [], [] -> [i32]
		0x02, 0x26, 0x01, 0x16, 'w', 'a', 's', 'i', '_', 's', 'n', 'a', 'p', 's', 'h', 'o', 't', '_', 'p', 'r', 'e', 'v', 'i', 'e', 'w', '1',
		0x0B, 's', 'c', 'h', 'e', 'd', '_', 'y', 'i', 'e', 'l', 'd', 0x00, 0x01, // import func 0: sched_yield
		0x03, 0x02, 0x01, 0x00, // func 1: type 0
		0x08, 0x01, 0x01, // start: func 1
		0x0A, 0x09, 0x01, 0x07, 0x00, 0x03, 0x40, 0x0C, 0x00, 0x0B, 0x0B, // loop br 0 end end
	}
	startLoopNoYield = []byte{
		0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00,
		0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // type 0: [] -> []
		0x03, 0x02, 0x01, 0x00, // func 0: type 0
		0x08, 0x01, 0x00, // start: func 0
		0x0A, 0x09, 0x01, 0x07, 0x00, 0x03, 0x40, 0x0C, 0x00, 0x0B, 0x0B, // loop br 0 end end
	}
)

// A loop in a start function, a wasm start section or a Go init (run by
// _initialize), is stopped by the load's deadline: the load fails in time
// instead of hanging.
func TestDeadlineStopsStartFunctions(t *testing.T) {
	const timeout = 300 * time.Millisecond
	dir := t.TempDir()
	start, startNoYield := filepath.Join(dir, "start.wasm"), filepath.Join(dir, "start_no_yield.wasm")
	require.NoError(t, os.WriteFile(start, startLoop, 0o600))
	require.NoError(t, os.WriteFile(startNoYield, startLoopNoYield, 0o600))
	for _, tc := range []struct {
		path string
		lim  host.Limits
	}{
		{start, host.Limits{ManifestTimeout: timeout}},
		{startNoYield, host.Limits{ManifestTimeout: timeout}},
		{start, host.Limits{ManifestTimeout: timeout, RuntimeDeadline: true}}, // the fallback
		{wasmbuild.Build(t, "./internal/host/testdata/plugins/behave", "initLoop=yes"), host.Limits{ManifestTimeout: timeout}},
	} {
		path := tc.path
		l, err := host.NewLoader(host.LoaderOptions{Limits: generous(tc.lim), CacheDir: wasmbuild.CacheDir(t)})
		require.NoError(t, err)
		began := time.Now()
		_, err = l.LoadFile(context.Background(), path)
		took := time.Since(began)
		require.ErrorIs(t, err, host.ErrManifestTimeout, path)
		// Loading includes compiling, which the deadline does not cover.
		t.Logf("%s: load failed after %s: %v", filepath.Base(path), took, err)
		require.NoError(t, l.Close(context.Background()))
	}
}

// An instrumented module answers exactly as the module it was made from:
// the example projector on a batch, and the behave module's ops.
func TestInstrumentedModulesGiveTheOriginalsResults(t *testing.T) {
	load := func(lim host.Limits, pkg string) *host.Module {
		l, err := host.NewLoader(host.LoaderOptions{Limits: generous(lim), CacheDir: wasmbuild.CacheDir(t)})
		require.NoError(t, err)
		path := ""
		if strings.HasSuffix(pkg, ".c") {
			path = wasmbuild.BuildC(t, pkg)
		} else {
			path = wasmbuild.Build(t, pkg)
		}
		m, err := l.LoadFile(context.Background(), wasmbuild.Copy(t, path, t.TempDir(), "client_orders.wasm"))
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = m.Close(context.Background())
			_ = l.Close(context.Background())
		})
		return m
	}
	for _, tc := range []struct {
		pkg, handler string
		msgs         []abi.Envelope
		s            func() host.Session
	}{
		{"./plugins/examples/client_orders", "client_orders", events(50), func() host.Session { return &docSession{doc: startDoc} }},
		{"plugins/c/client_orders.c", "client_orders", events(50), func() host.Session { return &docSession{doc: startDoc} }},
		{"./internal/host/testdata/plugins/behave", "behave", ops("ok", "load", "read", "transient", "rejected", "load"), func() host.Session {
			return &memSession{records: map[string]abi.LoadResponse{"behave/d": {Found: true, Version: 4, Data: json.RawMessage(`{"seen": ["before"]}`)}}}
		}},
	} {
		orig := load(host.Limits{Uninterruptible: true}, tc.pkg)
		inst := load(host.Limits{}, tc.pkg)
		require.Equal(t, host.DeadlineOff, orig.Deadline)
		require.Equal(t, host.DeadlineInstrumented, inst.Deadline)
		want, err := orig.Handle(context.Background(), tc.handler, tc.msgs, tc.s())
		require.NoError(t, err)
		got, err := inst.Handle(context.Background(), tc.handler, tc.msgs, tc.s())
		require.NoError(t, err)
		wantJSON, _ := json.Marshal(want)
		gotJSON, _ := json.Marshal(got)
		require.JSONEq(t, string(wantJSON), string(gotJSON), tc.pkg)
	}
}

// signalSession tells when a guest loads (the load_loop op then loops).
type signalSession struct{ loaded chan struct{} }

func (s *signalSession) Load(context.Context, *abi.LoadRequest) abi.LoadResponse {
	s.loaded <- struct{}{}
	return abi.LoadResponse{}
}

func (s *signalSession) ReadStream(context.Context, *abi.ReadStreamRequest, int) abi.ReadStreamResponse {
	return abi.ReadStreamResponse{}
}

// Guests looping on every P do not stall the process: the instrumented
// loop calls into the host every instrument.Period checks, where the Go
// scheduler can preempt it, so a garbage collection (which stops the
// world) completes while they spin. (Compiled guest code itself cannot be
// preempted: with interruptible = false the collection would wait for the
// guests to end.)
func TestSpinningGuestsDoNotBlockTheCollector(t *testing.T) {
	n := runtime.GOMAXPROCS(0)
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{Timeout: time.Hour}), Instances: n, CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = m.Close(context.Background())
		_ = l.Close(context.Background())
	})
	ctx, cancel := context.WithCancel(context.Background())
	s := &signalSession{loaded: make(chan struct{}, n)}
	done := make(chan error, n)
	for range n {
		go func() {
			_, err := m.Handle(ctx, "behave", []abi.Envelope{{ID: "1", Type: "Op", Data: json.RawMessage(`{"op":"load_loop","id":"d","arg":"x"}`)}}, s)
			done <- err
		}()
	}
	for range n {
		testwait.Recv(t, "a guest to reach its loop", s.loaded)
	}
	collected := make(chan struct{}, 1)
	go func() {
		runtime.GC()
		collected <- struct{}{}
	}()
	testwait.Recv(t, "a garbage collection while every P runs a guest", collected)
	cancel()
	for range n {
		require.ErrorIs(t, testwait.Recv(t, "a canceled guest to return", done), host.ErrCanceled)
	}
}
