package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// memSession serves loads from a map and counts calls.
type memSession struct {
	mu      sync.Mutex
	records map[string]abi.LoadResponse
	loads   int
}

func (s *memSession) Load(_ context.Context, r *abi.LoadRequest) abi.LoadResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loads++
	return s.records[r.Type+"/"+r.ID]
}

func (s *memSession) ReadStream(_ context.Context, r *abi.ReadStreamRequest, _ int) abi.ReadStreamResponse {
	return abi.ReadStreamResponse{Messages: []abi.Envelope{{ID: "1", Type: "Op", Stream: r.Stream, Data: json.RawMessage(`{}`)}}}
}

func ops(ops ...string) []abi.Envelope {
	var out []abi.Envelope
	for i, op := range ops {
		arg := ""
		if op == "read" {
			arg = "ops-x"
		}
		out = append(out, abi.Envelope{ID: fmt.Sprint(i), Type: "Op",
			Data: json.RawMessage(fmt.Sprintf(`{"op": %q, "id": "d", "arg": %q}`, op, arg+fmt.Sprint(i)))})
	}
	return out
}

func behave(t *testing.T, lim host.Limits) *host.Module {
	t.Helper()
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(lim), Instances: 2, CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = m.Close(context.Background())
		_ = l.Close(context.Background())
	})
	return m
}

func TestHandleResultsAndErrorKinds(t *testing.T) {
	m := behave(t, host.Limits{})
	ctx := context.Background()
	s := &memSession{records: map[string]abi.LoadResponse{"behave/d": {Found: true, Version: 4, Data: json.RawMessage(`{"seen": ["before"]}`)}}}

	res, err := m.Handle(ctx, "behave", ops("ok", "load", "load"), s)
	require.NoError(t, err)
	require.Len(t, res, 3)
	require.Equal(t, int64(4), res[1].Effects.Writes[0].ExpectedVersion)
	require.Equal(t, int64(5), res[2].Effects.Writes[0].ExpectedVersion)
	require.JSONEq(t, `{"seen": ["before", "1", "2"]}`, string(res[2].Effects.Writes[0].Data))
	require.Equal(t, 1, s.loads)

	for op, kind := range map[string]abi.ErrorKind{"transient": abi.ErrorTransient, "rejected": abi.ErrorRejected, "panic": abi.ErrorPermanent} {
		res, err := m.Handle(ctx, "behave", ops("ok", op, "ok"), s)
		require.NoError(t, err, op)
		require.Len(t, res, 2, op)
		require.Equal(t, kind, res[1].Error.Kind, op)
	}

	res, err = m.Handle(ctx, "behave", ops("read"), s)
	require.NoError(t, err)
	require.Equal(t, "ops-d", res[0].Effects.Events[0].Stream)
	require.JSONEq(t, `{"op": "read", "id": "d", "arg": "1"}`, string(res[0].Effects.Events[0].Data))
}

func TestHandleSandbox(t *testing.T) {
	// The loop meets this deadline; the call after it, which checks the
	// module still serves, must not, even under -race on a loaded machine.
	slow := behave(t, host.Limits{Timeout: 5 * time.Second})
	// A small memory cap makes the stack overflow and the OOM come soon
	// (growing a guest's stack is slow, most of all under -race).
	m := behave(t, host.Limits{Timeout: time.Minute, MemoryMB: 16, MaxOutputBytes: 1 << 20})
	roomy := behave(t, host.Limits{Timeout: time.Minute, MemoryMB: 64, MaxOutputBytes: 1 << 20})
	ctx := context.Background()
	tests := []struct {
		op   string
		is   error
		want string
	}{
		{"loop", host.ErrTimeout, "call exceeded its deadline (limit 5s)"},
		{"oom", host.ErrTrap, "module trapped"},
		{"stack", host.ErrTrap, "module trapped"},
		{"big", host.ErrOutput, "exceeds the 1048576-byte limit"},
	}
	for _, tc := range tests {
		t.Run(tc.op, func(t *testing.T) {
			m := m
			switch tc.op {
			case "loop":
				m = slow
			case "big": // room to build the output, which the limit then refuses
				m = roomy
			}
			_, err := m.Handle(ctx, "behave", ops("ok", tc.op), &memSession{})
			require.ErrorIs(t, err, tc.is)
			var ce *host.CallError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, "behave", ce.Handler)
			require.Contains(t, err.Error(), tc.want)
			// The module keeps serving after each failure.
			res, err := m.Handle(ctx, "behave", ops("ok"), &memSession{})
			require.NoError(t, err)
			require.Len(t, res, 1)
		})
	}
}

func TestHandleGuestReportedFailure(t *testing.T) {
	m := behave(t, host.Limits{})
	// The kit refuses a handler it does not have by returning non-zero with
	// an error string: a failure the guest reports, not a trap.
	_, err := m.Handle(context.Background(), "nobody", ops("ok"), &memSession{})
	require.ErrorIs(t, err, host.ErrFailed)
	require.ErrorContains(t, err, `module behave has no handler "nobody"`)
	res, err := m.Handle(context.Background(), "behave", ops("ok"), &memSession{})
	require.NoError(t, err)
	require.Len(t, res, 1)
}

func TestHandleCanceled(t *testing.T) {
	m := behave(t, host.Limits{Timeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := m.Handle(ctx, "behave", ops("loop"), &memSession{})
		done <- err
	}()
	cancel()
	require.ErrorIs(t, testwait.Recv(t, "the canceled call to return", done), host.ErrCanceled)
}

func TestHandleConcurrent(t *testing.T) {
	m := behave(t, host.Limits{})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := &memSession{}
			for j := 0; j < 5; j++ {
				res, err := m.Handle(context.Background(), "behave", ops("load", "load"), s)
				if err != nil {
					errs <- err
					return
				}
				if len(res) != 2 || res[1].Effects.Writes[0].ExpectedVersion != 1 {
					errs <- fmt.Errorf("bad results %+v", res)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

func TestUninterruptibleModulesRunToCompletion(t *testing.T) {
	slow := []abi.Envelope{{ID: "1", Type: "Slow", Data: json.RawMessage(`{"id":"a","ms":400}`)}}
	// Deadlines are enforced by default…
	m := behave(t, host.Limits{Timeout: 100 * time.Millisecond})
	_, err := m.Handle(context.Background(), "slow", slow, &memSession{})
	require.ErrorIs(t, err, host.ErrTimeout)
	// …and not for a module marked uninterruptible (a trusted tenant's):
	// its call runs to the end and its result stands.
	u := behave(t, host.Limits{Timeout: 100 * time.Millisecond, Uninterruptible: true})
	res, err := u.Handle(context.Background(), "slow", slow, &memSession{})
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.Equal(t, "slow-a", res[0].Effects.Events[0].Stream)
}

func TestTrapsAreClassifiedByType(t *testing.T) {
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{Timeout: time.Minute, MemoryMB: 16}), Instances: 1, CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	tm, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/trap"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = tm.Close(context.Background()) })
	bm := behave(t, host.Limits{Timeout: time.Minute, MemoryMB: 16, MaxOutputBytes: 1 << 20})
	op := func(name string) []abi.Envelope {
		return []abi.Envelope{{ID: "1", Type: "Trap", Data: json.RawMessage(`{"op":"` + name + `"}`)}}
	}
	ctx := context.Background()
	tests := []struct {
		name   string
		call   func() error
		reason string // "" for a guest-reported failure
	}{
		// A Go guest aborts on out-of-memory and on a stack overflow with
		// the unreachable instruction.
		{"oom", func() error { _, err := bm.Handle(ctx, "behave", ops("oom"), &memSession{}); return err }, "unreachable"},
		{"stack", func() error { _, err := bm.Handle(ctx, "behave", ops("stack"), &memSession{}); return err }, "unreachable"},
		{"oob", func() error { _, err := tm.Handle(ctx, "trap", op("oob"), &memSession{}); return err }, "out of bounds memory access"},
		{"exit", func() error { _, err := tm.Handle(ctx, "trap", op("exit"), &memSession{}); return err }, host.TrapExit},
		{"fail", func() error { _, err := tm.Handle(ctx, "trap", op("fail"), &memSession{}); return err }, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var ce *host.CallError
			require.ErrorAs(t, err, &ce)
			var te *host.TrapError
			if tc.reason == "" {
				require.False(t, errors.As(err, &te), "a guest's failure is not a trap: %v", err)
				require.ErrorIs(t, err, host.ErrFailed)
				require.NotErrorIs(t, err, host.ErrTrap)
				return
			}
			require.ErrorAs(t, err, &te, "%v", err)
			require.ErrorIs(t, err, host.ErrTrap)
			require.Equal(t, tc.reason, te.Reason)
			if tc.reason == host.TrapExit {
				require.Equal(t, uint32(3), te.ExitCode)
			}
		})
	}
	// The module serves again after each.
	_, err = tm.Handle(ctx, "trap", op("ok"), &memSession{})
	require.NoError(t, err)
}
