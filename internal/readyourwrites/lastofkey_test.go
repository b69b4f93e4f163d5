package readyourwrites

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// keyOf is the partition key of an event whose payload holds field as a
// string (partition.FieldKey, which this package may not import).
func keyOf(data json.RawMessage, field string) (string, bool) {
	var v map[string]any
	if json.Unmarshal(data, &v) != nil {
		return "", false
	}
	k, ok := v[field].(string)
	return k, ok
}

// forwardOnly hides a store's backward read: lastOfKey falls back to the
// forward walk. reads counts its reads and the events they return.
type forwardOnly struct {
	Events
	reads, events int
}

func (f *forwardOnly) ReadCategory(ctx context.Context, category string, from int64, n int) ([]eventstore.Event, error) {
	evs, err := f.Events.ReadCategory(ctx, category, from, n)
	f.reads++
	f.events += len(evs)
	return evs, err
}

// backward counts a backward store's backward reads and the events they
// return.
type backward struct {
	*forwardOnly
	br            eventstore.BackwardReader
	reads, events int
}

func (b *backward) ReadCategoryBackward(ctx context.Context, category string, after, to int64, n int) ([]eventstore.Event, error) {
	evs, err := b.br.ReadCategoryBackward(ctx, category, after, to, n)
	b.reads++
	b.events += len(evs)
	return evs, err
}

// keyedEvent is an event of category c (or, other, of category o) whose
// field "id" is key k, or that has no key when k < 0.
func keyedEvent(other bool, k, i int) eventstore.NewEvent {
	cat := "c"
	if other {
		cat = "o"
	}
	data := fmt.Sprintf(`{"id":"k%d","n":%d,"note":"an order line of some length, as payloads are"}`, k, i)
	if k < 0 {
		data = fmt.Sprintf(`{"n":%d}`, i)
	}
	return eventstore.NewEvent{
		Stream: fmt.Sprintf("%s-k%d", cat, k), Type: "Happened", Data: json.RawMessage(data),
		Metadata:        json.RawMessage(`{"correlation_id":"0b6f7c52-8f5e-4bd4-a3d7-8a5b2f0e6c11","causation_id":"5a1d2e3f-4b5c-4d6e-8f70-8192a3b4c5d6","trace":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`),
		ExpectedVersion: eventstore.AnyVersion,
	}
}

// requireSameAsTheWalk appends a random event set to store and asks
// lastOfKey, backward and forward, for random keys, floors and ns: the
// answers are the same.
func requireSameAsTheWalk(t *testing.T, store interface {
	Events
	eventstore.Appender
	eventstore.BackwardReader
}, seed uint64, sets, asks int) {
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(seed, 1))
	var head int64
	for set := range sets {
		keys := 1 + rng.IntN(64)
		evs := make([]eventstore.NewEvent, 1+rng.IntN(1500))
		for i := range evs {
			k := rng.IntN(keys)
			if rng.IntN(20) == 0 {
				k = -1
			}
			evs[i] = keyedEvent(rng.IntN(3) == 0, k, i)
		}
		for len(evs) > 0 { // in batches, as commands append
			b := min(len(evs), 1+rng.IntN(50))
			out, err := store.Append(ctx, evs[:b])
			require.NoError(t, err)
			head = out[len(out)-1].GlobalPosition
			evs = evs[b:]
		}
		fwd := &forwardOnly{Events: store}
		walk := New(Options{Events: fwd, KeyOf: keyOf})
		back := New(Options{Events: &backward{forwardOnly: fwd, br: store}, KeyOf: keyOf})
		for range asks {
			n := rng.Int64N(head+20) + 1
			floor := max(0, n-1-rng.Int64N(n+600))
			p := &pass{field: "id", key: fmt.Sprintf("k%d", rng.IntN(keys+2))}
			want, err := walk.lastOfKey(ctx, "c", floor, n, p)
			require.NoError(t, err)
			got, err := back.lastOfKey(ctx, "c", floor, n, p)
			require.NoError(t, err)
			require.Equal(t, want, got, "set %d: key %s in (%d, %d]", set, p.key, floor, n)
		}
	}
}

// lastOfKey reading backward finds what the forward walk finds, over
// random event sets (of two categories, some events without the key),
// keys (some with no events), floors and ns (some past the head).
func TestLastOfKeyBackwardIsTheWalk(t *testing.T) {
	t.Parallel()
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			requireSameAsTheWalk(t, eventstore.NewMemory(nil), seed, 4, 200)
		})
	}
}

func TestLastOfKeyBackwardIsTheWalkOnPostgres(t *testing.T) {
	t.Parallel()
	requireSameAsTheWalk(t, eventstore.NewPostgres(testserver.PostgresPool(t)), 7, 2, 100)
}

// The usual search, for the reader's own command's event at n, is one
// backward read of one page, whatever lies below; a key 300 events back
// takes pages of 16, 64 and 256 events; a read stops at the floor.
func TestLastOfKeyReadsBackwardInGrowingPages(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store := eventstore.NewMemory(nil)
	evs := make([]eventstore.NewEvent, 2000)
	for i := range evs {
		evs[i] = keyedEvent(false, 1+i%64, i)
	}
	evs[len(evs)-301] = keyedEvent(false, 0, 0)
	out, err := store.Append(ctx, evs)
	require.NoError(t, err)
	n := out[len(out)-1].GlobalPosition
	b := &backward{forwardOnly: &forwardOnly{Events: store}, br: store}
	w := New(Options{Events: b, KeyOf: keyOf})

	got, err := w.lastOfKey(ctx, "c", 0, n, &pass{field: "id", key: fmt.Sprintf("k%d", 1+(len(evs)-1)%64)})
	require.NoError(t, err)
	require.Equal(t, n, got)
	require.Equal(t, 1, b.reads)
	require.Equal(t, firstBackPage, b.events)
	require.Zero(t, b.forwardOnly.reads, "no forward read")

	b.reads, b.events = 0, 0
	got, err = w.lastOfKey(ctx, "c", 0, n, &pass{field: "id", key: "k0"})
	require.NoError(t, err)
	require.Equal(t, out[len(out)-301].GlobalPosition, got)
	require.Equal(t, 3, b.reads)
	require.Equal(t, 16+64+256, b.events)

	b.reads, b.events = 0, 0
	got, err = w.lastOfKey(ctx, "c", n-5, n, &pass{field: "id", key: "k0"})
	require.NoError(t, err)
	require.Zero(t, got, "none above the floor")
	require.Equal(t, 1, b.reads)
	require.Equal(t, 5, b.events, "a page reads no further than the floor")
}

// size is about what the store sent for ev: the fields it filled.
func size(ev eventstore.Event) int {
	n := len(ev.ID) + len(ev.Stream) + len(ev.Type) + len(ev.Data) + len(ev.Metadata) + 8 // global position
	if ev.Stream != "" {
		n += 8 + 8 // position, time
	}
	return n
}

// sized sums what a counted store's reads returned.
type sized struct {
	Events
	br    eventstore.BackwardReader
	bytes int
}

func (s *sized) ReadCategory(ctx context.Context, category string, from int64, n int) ([]eventstore.Event, error) {
	evs, err := s.Events.ReadCategory(ctx, category, from, n)
	for _, ev := range evs {
		s.bytes += size(ev)
	}
	return evs, err
}

type sizedBackward struct{ *sized }

func (s sizedBackward) ReadCategoryBackward(ctx context.Context, category string, after, to int64, n int) ([]eventstore.Event, error) {
	evs, err := s.br.ReadCategoryBackward(ctx, category, after, to, n)
	for _, ev := range evs {
		s.bytes += size(ev)
	}
	return evs, err
}

// BenchmarkLastOfKeyPostgres is the search for a key's last event on
// PostgreSQL, in a category of 5,000 events of 64 keys, from n with the
// floor far below: for the key of the event at n (a reader's own
// command's, the usual case) and for a key whose last event is 300
// events back; walk is the forward walk of windows of whole events,
// backward the backward pages. read_B/op is about what the store sent
// (the fields it filled), events/op the events it returned.
func BenchmarkLastOfKeyPostgres(b *testing.B) {
	ctx := b.Context()
	store := eventstore.NewPostgres(testserver.PostgresPool(b))
	evs := make([]eventstore.NewEvent, 5000)
	for i := range evs {
		evs[i] = keyedEvent(false, 1+i%63, i)
	}
	evs[len(evs)-301] = keyedEvent(false, 0, 0)
	var n int64
	for i := 0; i < len(evs); i += 100 {
		out, err := store.Append(ctx, evs[i:i+100])
		require.NoError(b, err)
		n = out[len(out)-1].GlobalPosition
	}
	for _, c := range []struct{ name, key string }{{"at_n", fmt.Sprintf("k%d", 1+(len(evs)-1)%63)}, {"300_back", "k0"}} {
		for _, how := range []string{"walk", "backward"} {
			b.Run(c.name+"/"+how, func(b *testing.B) {
				s := &sized{Events: store, br: store}
				var events Events = s
				if how == "backward" {
					events = sizedBackward{s}
				}
				w := New(Options{Events: events, KeyOf: keyOf})
				var got int64
				for b.Loop() {
					var err error
					got, err = w.lastOfKey(ctx, "c", 0, n, &pass{field: "id", key: c.key})
					require.NoError(b, err)
				}
				require.NotZero(b, got)
				b.ReportMetric(float64(s.bytes)/float64(b.N), "read_B/op")
			})
		}
	}
}
