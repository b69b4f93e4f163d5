package host_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// mapSession serves the client_orders documents it holds, and answers
// the ids in fail with the given error kind.
type mapSession struct {
	docs map[string]abi.LoadResponse
	fail map[string]abi.HostErrorKind
}

func (s *mapSession) Load(_ context.Context, r *abi.LoadRequest) abi.LoadResponse {
	if k, ok := s.fail[r.ID]; ok {
		return abi.LoadResponse{Error: "refused " + r.ID, ErrorKind: k}
	}
	if r.Kind != abi.RecordProjection || r.Type != "client_orders" {
		return abi.LoadResponse{Error: "unexpected load", ErrorKind: abi.HostScope}
	}
	return s.docs[r.ID]
}

func (s *mapSession) ReadStream(context.Context, *abi.ReadStreamRequest, int) abi.ReadStreamResponse {
	return abi.ReadStreamResponse{Error: "no streams", ErrorKind: abi.HostInvalid}
}

func placedEvent(order, client string, total any) abi.Envelope {
	data, _ := json.Marshal(map[string]any{"order_id": order, "client_id": client, "total": total})
	return abi.Envelope{ID: "e-" + order, Type: "OrderPlaced", Stream: "order-" + order, Data: data}
}

// The C client_orders (plugins/c, written from abi/v2.md without the Go
// kit) gives the Go projector's results on every batch: one client and
// many, documents found, missing and deleted, escaped strings, and each
// way a message fails.
func TestCClientOrdersMatchesGo(t *testing.T) {
	goMod := loadBuilt(t, "./plugins/examples/client_orders")
	m, err := sharedLoader(t).LoadFile(context.Background(), wasmbuild.Copy(t, wasmbuild.BuildC(t, "plugins/c/client_orders.c"), t.TempDir(), "client_orders.wasm"))
	require.NoError(t, err)
	defer m.Close(context.Background())
	require.Equal(t, 2, m.Manifest.ABIVersion)
	require.Equal(t, goMod.Manifest, m.Manifest, "the C module declares what the Go one does")
	require.Equal(t, host.DeadlineInstrumented, m.Deadline, "the C module imports sched_yield, so its deadline is the cheap one")

	bad := abi.Envelope{ID: "x", Type: "OrderPlaced", Stream: "order-x", Data: json.RawMessage(`{"order_id": 7`)}
	other := abi.Envelope{ID: "y", Type: "OrderCancelled", Stream: "order-y", Data: json.RawMessage(`{"order_id":"y"}`)}
	session := func() *mapSession {
		return &mapSession{
			docs: map[string]abi.LoadResponse{
				"c-1":  {Found: true, Version: 3, Data: startDoc},
				"gone": {Found: false, Version: 9},
				"odd":  {Found: true, Version: 1, Data: json.RawMessage(` { "order_ids" : [ "\u00e9\"q" ] , "extra": {"a": [1, {"b": "]"}]}, "total": 1e2, "orders": 1 } `)},
			},
			fail: map[string]abi.HostErrorKind{"scoped": abi.HostScope, "flaky": abi.HostTransient},
		}
	}
	batches := map[string][]abi.Envelope{
		"50 of one client": events(50),
		"clients": {placedEvent("o-1", "c-1", 1.5), placedEvent("o-2", "new", 2), placedEvent("o-3", "c-1", 0.25),
			placedEvent("o-4", "gone", 1), placedEvent("o-5", "odd", 0.1), placedEvent("o-6", "new", 1e-7)},
		"escapes":        {placedEvent("o-\"1\"\n\u2028é", "c-\\é", 3)},
		"bad payload":    {placedEvent("o-1", "c-1", 1), bad, placedEvent("o-2", "c-1", 1)},
		"other type":     {other},
		"scope error":    {placedEvent("o-1", "c-1", 1), placedEvent("o-2", "scoped", 1)},
		"transient load": {placedEvent("o-1", "flaky", 1)},
	}
	for name, batch := range batches {
		want, err := goMod.Handle(context.Background(), "client_orders", batch, session())
		require.NoError(t, err, name)
		got, err := m.Handle(context.Background(), "client_orders", batch, session())
		require.NoError(t, err, name)
		require.Len(t, got, len(want), name)
		for i := range want {
			if want[i].Error != nil {
				require.NotNil(t, got[i].Error, "%s: result %d", name, i)
				require.Equal(t, want[i].Error.Kind, got[i].Error.Kind, "%s: result %d: %s", name, i, got[i].Error.Message)
				continue
			}
			require.Nil(t, got[i].Error, "%s: result %d", name, i)
			w, g := want[i].Effects.Writes, got[i].Effects.Writes
			require.Len(t, g, len(w), "%s: result %d", name, i)
			for j := range w {
				require.JSONEq(t, string(w[j].Data), string(g[j].Data), "%s: result %d", name, i)
				w[j].Data, g[j].Data = nil, nil
			}
			require.Equal(t, want[i].Effects, got[i].Effects, "%s: result %d", name, i)
		}
	}
}
