package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// storeSession answers loads with a small record and stream reads from a
// real memory event store, page by page within the byte bound the host
// passes (eventstore's ReadStreamBytes), and records what it was asked.
type storeSession struct {
	events *eventstore.Memory
	// slowReads makes every stream read wait for the call's context to
	// end, as a long read of a slow store that the deadline cancels.
	slowReads bool

	mu       sync.Mutex
	loads    int
	reads    int
	maxBytes []int
	biggest  int // the most events one page held
}

func (s *storeSession) Load(context.Context, *abi.LoadRequest) abi.LoadResponse {
	s.mu.Lock()
	s.loads++
	s.mu.Unlock()
	return abi.LoadResponse{Found: true, Version: 1, Data: json.RawMessage(`{"seen": []}`)}
}

func (s *storeSession) ReadStream(ctx context.Context, r *abi.ReadStreamRequest, maxBytes int) abi.ReadStreamResponse {
	if s.slowReads {
		<-ctx.Done()
		s.mu.Lock()
		s.reads++
		s.mu.Unlock()
		return abi.ReadStreamResponse{Error: ctx.Err().Error(), ErrorKind: abi.HostTransient}
	}
	evs, err := s.events.ReadStreamBytes(ctx, r.Stream, r.From, r.Limit, maxBytes)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	s.maxBytes = append(s.maxBytes, maxBytes)
	s.biggest = max(s.biggest, len(evs))
	if err != nil {
		return abi.ReadStreamResponse{Error: err.Error(), ErrorKind: abi.HostTransient}
	}
	out := abi.ReadStreamResponse{Messages: make([]abi.Envelope, len(evs))}
	for i, ev := range evs {
		out.Messages[i] = abi.Envelope{ID: ev.ID, Type: ev.Type, Stream: ev.Stream, Position: ev.Position,
			GlobalPosition: ev.GlobalPosition, Data: ev.Data}
	}
	return out
}

// stream fills stream "pad-1" of a new memory store with n events of
// about size bytes each.
func stream(t *testing.T, n, size int) *eventstore.Memory {
	t.Helper()
	es := eventstore.NewMemory(nil)
	for range n {
		_, err := es.Append(t.Context(), []eventstore.NewEvent{{Stream: "pad-1", Type: "Padded",
			Data: json.RawMessage(fmt.Sprintf(`{"pad": %q}`, strings.Repeat("x", size))), ExpectedVersion: eventstore.AnyVersion}})
		require.NoError(t, err)
	}
	return es
}

func op(o, arg string) []abi.Envelope {
	return []abi.Envelope{{ID: "1", Type: "Op", Data: json.RawMessage(fmt.Sprintf(`{"op": %q, "id": "d", "arg": %q}`, o, arg))}}
}

// TestHostBudgets: what the host does on a guest's behalf is bounded per
// call, in both ABIs. A guest over a budget is stopped with a
// *HostLimitError that names the module, the host function and the
// limit; the instance is replaced and the module keeps serving; a guest
// within its budgets reads a long stream to its end, page by page, each
// page within max_read_bytes.
func TestHostBudgets(t *testing.T) {
	for _, abiVersion := range []string{"2", "1"} {
		t.Run("abi v"+abiVersion, func(t *testing.T) {
			var vars []string
			if abiVersion == "1" {
				vars = []string{"github.com/proteanhq/protean-host/pdk.abiFlag=1"}
			}
			wasm := wasmbuild.Build(t, "./internal/host/testdata/plugins/behave", vars...)
			load := func(t *testing.T, lim host.Limits) *host.Module {
				l, err := host.NewLoader(host.LoaderOptions{Limits: generous(lim), Instances: 1, CacheDir: wasmbuild.CacheDir(t)})
				require.NoError(t, err)
				m, err := l.LoadFile(context.Background(), wasm)
				require.NoError(t, err)
				t.Cleanup(func() {
					_ = m.Close(context.Background())
					_ = l.Close(context.Background())
				})
				return m
			}
			ctx := context.Background()
			refused := func(t *testing.T, err error, limit string) {
				t.Helper()
				require.ErrorIs(t, err, host.ErrHostLimit)
				var ce *host.CallError
				require.ErrorAs(t, err, &ce)
				var le *host.HostLimitError
				require.ErrorAs(t, err, &le)
				require.Equal(t, limit, le.Limit)
				require.Contains(t, err.Error(), "behave")
				require.Contains(t, err.Error(), "(limit "+limit+" = ")
			}

			t.Run("host calls", func(t *testing.T) {
				m := load(t, host.Limits{MaxHostCalls: 100})
				s := &storeSession{}
				_, err := m.Handle(ctx, "behave", op("load_flood", "1000000"), s)
				refused(t, err, host.LimitHostCalls)
				require.Equal(t, 100, s.loads, "the call ends at the limit")
				res, err := m.Handle(ctx, "behave", op("load_flood", "100"), &storeSession{})
				require.NoError(t, err, "a new instance serves within the limit")
				require.JSONEq(t, `{"op": "done", "id": "d", "arg": "100"}`, string(res[0].Effects.Events[0].Data))
			})

			t.Run("pages by bytes", func(t *testing.T) {
				m := load(t, host.Limits{MaxReadBytes: 256 << 10})
				s := &storeSession{events: stream(t, 40, 64<<10)}
				res, err := m.Handle(ctx, "behave", op("read_pages", "pad-1"), s)
				require.NoError(t, err)
				require.JSONEq(t, `{"op": "done", "id": "d", "arg": "40/14"}`, string(res[0].Effects.Events[0].Data),
					"every event, 3 of 64 KiB a page (a fourth would pass 256 KiB), then the empty page")
				require.LessOrEqual(t, s.biggest, 3)
				for _, b := range s.maxBytes {
					require.Equal(t, 256<<10, b)
				}
			})

			t.Run("bytes per call", func(t *testing.T) {
				m := load(t, host.Limits{MaxHostBytes: 4 << 20})
				s := &storeSession{events: stream(t, 40, 64<<10)}
				_, err := m.Handle(ctx, "behave", op("read_flood", "pad-1"), s)
				refused(t, err, host.LimitHostBytes)
				// Four pages of 1 MiB, then pages of what is left (one
				// event at least), then the call ends.
				require.LessOrEqual(t, s.reads, 8)
			})

			t.Run("deadline", func(t *testing.T) {
				// The deadline covers the time in host functions: a read
				// that outlasts it is canceled through its context, and
				// the call ends as out of time.
				// Long enough that a loaded machine still starts the read
				// before it: the read, not the guest, must meet it.
				m := load(t, host.Limits{Timeout: 2 * time.Second})
				// An instance made ahead (one per module here), so the
				// deadline is spent in the read, not in creating it.
				testwait.For(t, "a call within the deadline", func() (bool, string) {
					_, err := m.Handle(ctx, "behave", op("ok", ""), &storeSession{})
					return err == nil, fmt.Sprint(err)
				})
				s := &storeSession{slowReads: true}
				_, err := m.Handle(ctx, "behave", op("read_pages", "pad-1"), s)
				require.ErrorIs(t, err, host.ErrTimeout)
				require.Equal(t, 1, s.reads, "one read, canceled at the deadline")
			})

			t.Run("host memory", func(t *testing.T) {
				// One event larger than the instance's whole budget
				// (memory_mb 16 plus twice 1 MiB of output): the page
				// holds it alone, and holding it would pass the budget.
				m := load(t, host.Limits{MemoryMB: 16, MaxOutputBytes: 1 << 20})
				s := &storeSession{events: stream(t, 1, 19<<20)}
				_, err := m.Handle(ctx, "behave", op("read_pages", "pad-1"), s)
				refused(t, err, host.LimitMemory)
				res, err := m.Handle(ctx, "behave", op("load_flood", "1"), &storeSession{})
				require.NoError(t, err)
				require.JSONEq(t, `{"op": "done", "id": "d", "arg": "1"}`, string(res[0].Effects.Events[0].Data))
			})

		})
	}
}
