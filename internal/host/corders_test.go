package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// recordSession serves loads from the records the results of earlier
// calls wrote, as a host that committed them would.
type recordSession struct {
	emptySession
	records map[string]abi.LoadResponse
}

func (s *recordSession) Load(_ context.Context, r *abi.LoadRequest) abi.LoadResponse {
	return s.records[fmt.Sprintf("%v/%s/%s", r.Kind, r.Type, r.ID)]
}

// commit applies results' writes.
func (s *recordSession) commit(results []abi.Result) {
	for _, r := range results {
		if r.Effects == nil {
			continue
		}
		for _, w := range r.Effects.Writes {
			s.records[fmt.Sprintf("%v/%s/%s", w.Kind, w.Type, w.ID)] = abi.LoadResponse{Found: true, Version: w.ExpectedVersion + 1, Data: w.Data}
		}
	}
}

// The C orders (plugins/c/orders.c, ABI v2 without the Go kit) answers
// every command as the Go module does: the same events, record writes,
// expected versions and rejections, read-your-writes within a batch
// included. Payloads are compared as JSON.
func TestCOrdersAnswersAsTheGoModule(t *testing.T) {
	load := func(wasm string) *host.Module {
		l, err := host.NewLoader(host.LoaderOptions{CacheDir: wasmbuild.CacheDir(t)})
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		m, err := l.LoadFile(context.Background(), wasmbuild.Copy(t, wasm, t.TempDir(), "orders.wasm"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.Close(context.Background()) })
		return m
	}
	goMod := load(wasmbuild.Build(t, "./plugins/examples/orders"))
	cMod := load(wasmbuild.BuildC(t, "plugins/c/orders.c"))
	require.JSONEq(t, string(goMod.ManifestJSON()), string(cMod.ManifestJSON()))
	require.Equal(t, host.DeadlineInstrumented, cMod.Deadline, "it imports sched_yield, so its deadline is the cheap one")

	env := func(i int, typ, data string) abi.Envelope {
		return abi.Envelope{ID: fmt.Sprintf("m-%d", i), Type: typ, Data: json.RawMessage(data)}
	}
	steps := [][]abi.Envelope{
		{env(1, "PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":42.5}`)},
		{env(2, "PlaceOrder", `{"order_id":"o-1","client_id":"c-2","total":1}`)}, // exists
		{env(3, "PlaceOrder", `{"order_id":"","client_id":"c-1","total":1}`)},
		{env(4, "PlaceOrder", `{"order_id":"o-4","client_id":"c-1","total":-2.5}`)},
		{env(5, "CancelOrder", `{"order_id":"o-9"}`)}, // no such order
		{env(6, "CancelOrder", `{"order_id":"o-1"}`)},
		{env(7, "CancelOrder", `{"order_id":"o-1"}`)}, // cancelled already
		// One batch: the cancel sees the placement's write.
		{env(8, "PlaceOrder", `{"order_id":"o-8","client_id":"c-8","total":0.1}`), env(9, "CancelOrder", `{"order_id":"o-8"}`)},
		// Escapes and text beyond ASCII, unknown fields, a whole total.
		{env(10, "PlaceOrder", `{"note":{"x":[1,"}"]},"order_id":"o-\u00fc\"10\"","client_id":"c-\\1","total":3}`)},
	}
	goS := &recordSession{records: map[string]abi.LoadResponse{}}
	cS := &recordSession{records: map[string]abi.LoadResponse{}}
	for i, batch := range steps {
		want, err := goMod.Handle(context.Background(), "orders", batch, goS)
		require.NoError(t, err, "step %d", i)
		got, err := cMod.Handle(context.Background(), "orders", batch, cS)
		require.NoError(t, err, "step %d", i)
		requireSameResults(t, want, got, fmt.Sprintf("step %d", i))
		goS.commit(want)
		cS.commit(got)
	}
	// What either module left: the same records.
	require.Equal(t, len(goS.records), len(cS.records))
	for k, w := range goS.records {
		require.Equal(t, w.Version, cS.records[k].Version, k)
		require.JSONEq(t, string(w.Data), string(cS.records[k].Data), k)
	}

	// A type the handler does not handle fails permanently in both.
	for _, m := range []*host.Module{goMod, cMod} {
		res, err := m.Handle(context.Background(), "orders", []abi.Envelope{env(11, "RefundOrder", `{"order_id":"o-1"}`)}, goS)
		require.NoError(t, err)
		require.Len(t, res, 1)
		require.NotNil(t, res[0].Error, m.File)
		require.Equal(t, abi.ErrorPermanent, res[0].Error.Kind, m.File)
	}
}

func requireSameResults(t *testing.T, want, got []abi.Result, step string) {
	t.Helper()
	require.Len(t, got, len(want), step)
	for i := range want {
		w, g := want[i], got[i]
		require.Equal(t, w.Error, g.Error, "%s result %d", step, i)
		if w.Effects == nil {
			require.True(t, g.Effects.Empty(), "%s result %d", step, i)
			continue
		}
		require.NotNil(t, g.Effects, "%s result %d", step, i)
		require.Len(t, g.Effects.Events, len(w.Effects.Events), step)
		for j, we := range w.Effects.Events {
			ge := g.Effects.Events[j]
			require.Equal(t, we.Stream, ge.Stream, step)
			require.Equal(t, we.Type, ge.Type, step)
			require.Equal(t, we.ExpectedVersion, ge.ExpectedVersion, step)
			require.Equal(t, we.ID, ge.ID, step)
			require.JSONEq(t, string(we.Data), string(ge.Data), step)
		}
		require.Len(t, g.Effects.Writes, len(w.Effects.Writes), step)
		for j, ww := range w.Effects.Writes {
			gw := g.Effects.Writes[j]
			require.Equal(t, [4]any{ww.Kind, ww.Type, ww.ID, ww.ExpectedVersion}, [4]any{gw.Kind, gw.Type, gw.ID, gw.ExpectedVersion}, step)
			require.JSONEq(t, string(ww.Data), string(gw.Data), step)
		}
		require.Equal(t, w.Effects.Commands, g.Effects.Commands, step)
	}
}
