package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/testlog"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// abandonedCompilesEnd waits for the compilations a test abandoned to
// finish in the background (they cannot be interrupted), so none outlives
// the test binary's goroutine check.
func abandonedCompilesEnd(t *testing.T) {
	testwait.For(t, "abandoned compilations to finish", func() (bool, string) {
		n := host.AbandonedCompiles()
		return n == 0, fmt.Sprintf("%d still compiling", n)
	})
}

func loadBytes(t *testing.T, l *host.Loader, name string, b []byte) (*host.Module, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, b, 0o644))
	m, err := l.LoadFile(context.Background(), path)
	if m != nil {
		t.Cleanup(func() { _ = m.Close(context.Background()) })
	}
	return m, err
}

// TestHostileModulesAtLoad: each bad module is refused at load with a
// LoadError naming the file and the limit, and a good module loads after.
func TestHostileModulesAtLoad(t *testing.T) {
	l, err := host.NewLoader(host.LoaderOptions{Limits: host.Limits{ManifestTimeout: 2 * time.Second,
		CompileTimeout: 500 * time.Millisecond, MaxModuleBytes: 1 << 20}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	t.Cleanup(func() { abandonedCompilesEnd(t) })
	tests := []struct {
		name  string
		bytes []byte
		is    error
		want  string
	}{
		// table.grow far past the limit: wazero enforces the maximum the
		// host wrote into the table (none was declared), so nothing is
		// allocated, the guest sees -1 and reports it (code 7).
		{"table_grow_bomb.wasm", wasmbuild.TableGrower(-1, 1_000_000), host.ErrManifestFailed, "(code 7)"},
		{"table_declared_max.wasm", wasmbuild.TableGrower(1_000_000, 1), host.ErrTableLimit, "may grow to 1000000 elements (limit 100000)"},
		{"table_min.wasm", wasmbuild.RawModule(200_000, -1, []byte{0x41, 0}), host.ErrTableLimit, "starts at 200000 elements (limit 100000)"},
		{"too_large.wasm", append(wasmbuild.RawModule(0, 1, []byte{0x41, 0}), wasmbuild.Section(0, append([]byte{4, 'p', 'a', 'd', 's'}, make([]byte, 2<<20)...))...),
			host.ErrModuleTooLarge, "(limit 1048576)"},
		// Refused before compiling (TestCompileBombsRefusedBeforeCompiling
		// shows no compilation starts); TestCompileTimeout covers one
		// within the shape limits.
		{"compile_bomb.wasm", wasmbuild.CompileBomb(20000), host.ErrShapeLimit, "function 0: max_nesting_depth = 8192"},
		// A start function that never returns: instantiation runs under
		// the manifest deadline (the instrumented deadline stops it).
		{"start_loop.wasm", wasmbuild.StartLoop(), host.ErrManifestTimeout, "did not return in time"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadBytes(t, l, tc.name, tc.bytes)
			var le *host.LoadError
			require.ErrorAs(t, err, &le)
			require.Equal(t, tc.name, le.File)
			require.ErrorIs(t, err, tc.is)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	// A table grown within its limit works (the same module, a small grow).
	_, err = loadBytes(t, l, "table_small_grow.wasm", wasmbuild.TableGrower(-1, 10))
	require.ErrorContains(t, err, "(code 9)")
	m, err := sharedLoader(t).LoadFile(context.Background(), declared(t, "projector"))
	require.NoError(t, err)
	require.NoError(t, m.Close(context.Background()))
}

// noShapeLimits lets a compile bomb through to the compiler.
var noShapeLimits = host.Limits{MaxNestingDepth: 1 << 30, MaxNestingCost: 1 << 62}

// TestCompileTimeout: a module the shape limits let through (here: they
// are raised) that compiles for longer than compile_timeout_ms is refused
// when it passes; its compilation finishes in the background.
func TestCompileTimeout(t *testing.T) {
	lim := noShapeLimits
	lim.CompileTimeout = 500 * time.Millisecond
	l, err := host.NewLoader(host.LoaderOptions{Limits: lim})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	t.Cleanup(func() { abandonedCompilesEnd(t) })
	_, err = loadBytes(t, l, "compile_bomb.wasm", wasmbuild.CompileBomb(20000))
	var le *host.LoadError
	require.ErrorAs(t, err, &le)
	require.Equal(t, "compile_bomb.wasm", le.File)
	require.ErrorIs(t, err, host.ErrCompileTimeout)
	require.ErrorContains(t, err, "compilation did not finish in time (limit 500ms)")
}

// TestLoadCanceledWhileCompiling: a load canceled during a compilation
// returns at once, as a cancellation (a shutdown during a reload).
func TestLoadCanceledWhileCompiling(t *testing.T) {
	lim := noShapeLimits
	lim.CompileTimeout = time.Hour
	l, err := host.NewLoader(host.LoaderOptions{Limits: lim})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	t.Cleanup(func() { abandonedCompilesEnd(t) })
	path := filepath.Join(t.TempDir(), "bomb.wasm")
	require.NoError(t, os.WriteFile(path, wasmbuild.CompileBomb(20000), 0o644))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := l.LoadFile(ctx, path)
		done <- err
	}()
	cancel()
	err = testwait.Recv(t, "the canceled load to return", done)
	require.ErrorIs(t, err, host.ErrCanceled)
	require.NotErrorIs(t, err, host.ErrCompileTimeout)
}

// TestGuestRandomIsReal: two instances draw different bytes from
// crypto/rand (wazero's default source is a fixed seed).
func TestGuestRandomIsReal(t *testing.T) {
	draw := func() string {
		m := behave(t, host.Limits{})
		res, err := m.Handle(context.Background(), "behave", ops("rand"), &memSession{})
		require.NoError(t, err)
		require.Len(t, res, 1)
		require.NotNil(t, res[0].Effects, "%+v", res[0])
		var d struct{ Rand string }
		require.NoError(t, json.Unmarshal(res[0].Effects.Writes[0].Data, &d))
		return d.Rand
	}
	a, b := draw(), draw()
	require.Len(t, a, 32)
	require.NotEqual(t, a, b)
}

// TestInstanceThatExitedIsNotReused: a guest calling proc_exit(0) mid-call
// fails that call, and the next call gets a fresh instance.
func TestInstanceThatExitedIsNotReused(t *testing.T) {
	m := behave(t, host.Limits{})
	ctx := context.Background()
	_, err := m.Handle(ctx, "behave", ops("exit0"), &memSession{})
	require.Error(t, err)
	for range 3 {
		_, err = m.Handle(ctx, "behave", ops("ok"), &memSession{})
		require.NoError(t, err)
	}
	st := m.Instances()
	require.Equal(t, int64(1), st.Discarded["failed"]+st.Discarded["exited"], "the exited instance is counted thrown away")
	require.Equal(t, int64(2), st.Created, "one fresh instance served the three calls")
}

// blockingSession holds a guest inside protean_load until released,
// whatever the call's deadline (a host function is not preempted).
type blockingSession struct {
	entered chan struct{}
	release chan struct{}
}

func (s *blockingSession) Load(context.Context, *abi.LoadRequest) abi.LoadResponse {
	s.entered <- struct{}{}
	<-s.release
	return abi.LoadResponse{Found: true, Version: 1, Data: json.RawMessage(`{}`)}
}

func (s *blockingSession) ReadStream(context.Context, *abi.ReadStreamRequest, int) abi.ReadStreamResponse {
	return abi.ReadStreamResponse{}
}

// TestWaitForInstanceIsBounded: with every instance busy, a call waits at
// most its deadline, then fails with ErrNoInstance naming the limit and
// saying how long it waited (CallError.Waited).
func TestWaitForInstanceIsBounded(t *testing.T) {
	// One instance for this module (the tenant's max_instances), whatever
	// the loader's default.
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{Timeout: 2 * time.Second, Instances: 1}),
		Instances: 4, CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	s := &blockingSession{entered: make(chan struct{}, 1), release: make(chan struct{})}
	// The holding call's deadline covers its instance's start, which on a
	// loaded machine, under -race, can take longer: such a call ends before its load,
	// and another is started until one holds the instance.
	var first chan error
	testwait.For(t, "a call to hold the only instance", func() (bool, string) {
		if first == nil {
			first = make(chan error, 1)
			go func() {
				_, err := m.Handle(context.Background(), "behave", ops("load"), s)
				first <- err
			}()
		}
		select {
		case <-s.entered:
			return true, ""
		case err := <-first:
			first = nil
			return false, fmt.Sprintf("a call ended before its load: %v", err)
		default:
			return false, "no call in its load yet"
		}
	})
	_, err = m.Handle(context.Background(), "behave", ops("ok"), &memSession{})
	require.ErrorIs(t, err, host.ErrNoInstance)
	require.ErrorContains(t, err, "plugin "+m.File)
	require.ErrorContains(t, err, "all 1 instances busy (limit 2s)")
	var ce *host.CallError
	require.ErrorAs(t, err, &ce)
	require.GreaterOrEqual(t, ce.Waited, 2*time.Second, "the whole deadline went by waiting for an instance")
	close(s.release)
	testwait.Recv(t, "the first call to end", first)
}

// TestGuestLogsReachTheHostLog: guest log lines are forwarded with the
// module's name, and a flood is cut to the module's burst.
func TestGuestLogsReachTheHostLog(t *testing.T) {
	var buf testlog.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{LogBurst: 5, LogsPerSecond: 1}),
		CacheDir: wasmbuild.CacheDir(t), Logger: log})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	env := []abi.Envelope{{ID: "1", Type: "Op", Data: json.RawMessage(`{"op":"log","id":"d","arg":"1000"}`)}}
	_, err = m.Handle(context.Background(), "behave", env, &memSession{})
	require.NoError(t, err)
	out := buf.Take()
	n := strings.Count(out, "behave says hello")
	require.GreaterOrEqual(t, n, 5, out)
	require.Less(t, n, 1000, "a flood is rate-limited")
	require.Contains(t, out, "module="+m.File)
}

// TestInstanceOverHighWaterIsRecycled: an instance whose memory grew past
// recycle_above_mb during a call is closed after it; the next call starts
// on a fresh one (what the first left in memory is gone). Below the mark
// the instance is reused.
func TestInstanceOverHighWaterIsRecycled(t *testing.T) {
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{RecycleAboveMB: 24, MemoryMB: 64, Instances: 1}),
		CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	call := func(op, arg string) []abi.Result {
		env := []abi.Envelope{{ID: "1", Type: "Op", Data: json.RawMessage(fmt.Sprintf(`{"op":%q,"id":"d","arg":%q}`, op, arg))}}
		res, err := m.Handle(context.Background(), "behave", env, &memSession{})
		require.NoError(t, err)
		return res
	}
	sink := func() int {
		var d struct{ Sink int }
		require.NoError(t, json.Unmarshal(call("sinklen", "")[0].Effects.Writes[0].Data, &d))
		return d.Sink
	}
	call("grow", "1")
	require.Equal(t, 1<<20, sink(), "below the mark the instance is reused")
	call("grow", "32")
	require.Equal(t, 0, sink(), "past the mark the next call runs on a fresh instance")
	st := m.Instances()
	require.Equal(t, host.InstanceStats{Max: 1, Live: 1, Idle: 1, Created: 2, Discarded: map[string]int64{"failed": 0, "memory": 1, "exited": 0, "idle": 0},
		CodeLoaded: true}, st)
}

// TestGuestHasNoFilesNetworkOrEnvironment: a guest trying the host's
// files, directories, environment and network gets nothing (WASI with
// nothing granted).
func TestGuestHasNoFilesNetworkOrEnvironment(t *testing.T) {
	m := behave(t, host.Limits{})
	res, err := m.Handle(context.Background(), "behave", ops("escape"), &memSession{})
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.NotNil(t, res[0].Effects, "%+v", res[0])
	require.JSONEq(t, `{}`, string(res[0].Effects.Writes[0].Data))
}

// TestWildPointersToV1HostFunctions: offsets that point nowhere, handed to
// protean_load and protean_read_stream, get an error answer (or none), the
// guest keeps running, and the module serves again.
func TestWildPointersToV1HostFunctions(t *testing.T) {
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{}), CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/wild"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	env := []abi.Envelope{{ID: "1", Type: "Wild", Data: json.RawMessage(`{"id":"w"}`)}}
	for range 2 {
		res, err := m.Handle(context.Background(), "wild", env, &memSession{})
		require.NoError(t, err)
		require.Len(t, res, 1)
		require.Nil(t, res[0].Error, "%+v", res[0].Error)
		require.Contains(t, string(res[0].Effects.Writes[0].Data), `"answers"`)
	}
}

// TestInstanceThatExitedAfterItsOutputIsNotReused: a call that sets its
// output and then exits with code 0 succeeds (Extism reports no error),
// but its instance is closed, not pooled: the next call runs on a fresh one.
func TestInstanceThatExitedAfterItsOutputIsNotReused(t *testing.T) {
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{Instances: 1}),
		CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/exiter"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	env := []abi.Envelope{{ID: "1", Type: "Exit", Data: json.RawMessage(`{}`)}}
	for i := range 3 {
		res, err := m.Handle(context.Background(), "exiter", env, &memSession{})
		require.NoError(t, err, "call %d", i)
		require.Len(t, res, 1)
	}
}
