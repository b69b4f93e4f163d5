package engine

import (
	"context"
	"encoding/json"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
	"github.com/proteanhq/protean-host/record"
)

// tenantEngine runs the example orders module as tenant "shop" and the
// hostile intruder module as tenant "intruder", with the shop granting the
// intruder read of category order (and, with dispatch, CancelOrder).
func tenantEngine(t *testing.T, dispatch bool) (*Engine, *unitofwork.Memory) {
	t.Helper()
	tenants := map[string]string{"orders": "shop", "intruder": "intruder"}
	grants := host.Grants{Read: map[string]map[string][]string{"shop": {"intruder": {"order"}}}}
	if dispatch {
		grants.Dispatch = map[string]map[string][]string{"shop": {"intruder": {"CancelOrder"}}}
	}
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{}), CacheDir: wasmbuild.CacheDir(t),
		Tenancy: host.Tenancy{Of: func(m string) string { return tenants[m] }, Grants: grants}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	var mods []*host.Module
	for _, pkg := range []string{"./plugins/examples/orders", "./internal/host/testdata/plugins/intruder"} {
		dir := t.TempDir()
		name := map[string]string{"./plugins/examples/orders": "orders.wasm", "./internal/host/testdata/plugins/intruder": "intruder.wasm"}[pkg]
		m, err := l.LoadFile(context.Background(), wasmbuild.Copy(t, wasmbuild.Build(t, pkg), dir, name))
		require.NoError(t, err)
		mods = append(mods, m)
	}
	require.Equal(t, "shop", mods[0].Tenant)
	require.Equal(t, "intruder", mods[1].Tenant)
	set, problems := host.NewTenantSet(mods, host.Broker{Name: "default", Provider: "inline"}, grants)
	require.Empty(t, problems)
	mem := unitofwork.NewMemory()
	e := New(set, Options{Events: mem.Events, Records: mem.Records, UnitOfWork: unitofwork.New(mem, unitofwork.Options{Broker: "default"})})
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	return e, mem
}

// TestTenantCannotTouchAnotherTenant pins the host's enforcement at run
// time against a module that lies: every host function (load, read_stream)
// and every effect (aggregate write, projection write, event append,
// follow-up command) outside its tenant's ownership and grants is refused
// with a *ScopeError naming the module and its tenant (the owner only in
// the operator's metric and log, never in what the guest or client
// reads), and the owner's data is unchanged; what the owner granted works.
func TestTenantCannotTouchAnotherTenant(t *testing.T) {
	e, mem := tenantEngine(t, false)
	ctx := context.Background()
	_, err := e.Dispatch(ctx, "PlaceOrder", json.RawMessage(`{"order_id":"o1","client_id":"c1","total":10}`), abi.Metadata{})
	require.NoError(t, err)
	order := func() record.Record {
		r, err := mem.Records.Load(ctx, record.Key{Kind: string(abi.RecordAggregate), Type: "order", ID: "o1"})
		require.NoError(t, err)
		return r
	}
	before := order()
	require.True(t, before.Exists())

	intrude := func(op string) (*CommandResult, error) {
		return e.Dispatch(ctx, "Intrude", json.RawMessage(`{"op":"`+op+`","id":"o1"}`), abi.Metadata{})
	}
	// Granted: read the shop's aggregate and stream.
	res, err := intrude("load")
	require.NoError(t, err)
	require.Len(t, res.Events, 1)
	res, err = intrude("read")
	require.NoError(t, err)
	require.Len(t, res.Events, 1)

	for _, tc := range []struct{ op, want, owner string }{
		{"load_payment", "may not read aggregates of category payment", ""},
		{"read_payment", "may not read stream payment-o1 of category payment", ""},
		{"write", "may not write aggregates of category order: it belongs to another tenant, which grants tenant intruder read only", "shop"},
		{"emit", "may not append OrderPlaced to stream order-o1: category order belongs to another tenant", "shop"},
		{"emit_undeclared", "emits event OrderCancelled, which the module does not declare", ""},
		{"projection", "projection client_orders is not a projector or process manager of the module", ""},
		{"dispatch", "may not dispatch command CancelOrder: it belongs to another tenant, which does not grant it to tenant intruder", "shop"},
	} {
		t.Run(tc.op, func(t *testing.T) {
			refusals := func() float64 {
				var m dto.Metric
				require.NoError(t, e.opts.Metrics.refusals.WithLabelValues("intruder.wasm", "intruder", tc.owner).Write(&m))
				return m.GetCounter().GetValue()
			}
			before := refusals()
			res, err := intrude(tc.op)
			require.Nil(t, res)
			var se *ScopeError
			require.ErrorAs(t, err, &se, "%v", err)
			require.Equal(t, "intruder.wasm", se.File)
			require.Equal(t, "intruder", se.Tenant)
			require.Contains(t, err.Error(), tc.want)
			// What the guest and the client read never names the other
			// tenant (nor its modules); the operator's metric does.
			require.NotContains(t, err.Error(), "shop")
			require.NotContains(t, err.Error(), "orders.wasm")
			require.Equal(t, tc.owner, se.Owner)
			require.Equal(t, before+1, refusals())
			var he *HandlerError
			require.ErrorAs(t, err, &he)
			require.False(t, he.Retryable())
		})
	}
	after := order()
	require.Equal(t, before.Version, after.Version, "the shop's aggregate is untouched")
	require.JSONEq(t, string(before.Data), string(after.Data))
	evs, err := mem.Events.ReadStream(ctx, "order-o1", 0, 0)
	require.NoError(t, err)
	require.Len(t, evs, 1, "no forged event on the shop's stream")
	_, _, err = e.Projection(ctx, "client_orders", "victim")
	require.Error(t, err)
}

// TestTenantDispatchGrant: with the shop's grant_dispatch, the intruder's
// follow-up CancelOrder is allowed and runs the shop's handler.
func TestTenantDispatchGrant(t *testing.T) {
	e, _ := tenantEngine(t, true)
	ctx := context.Background()
	_, err := e.Dispatch(ctx, "PlaceOrder", json.RawMessage(`{"order_id":"o1","client_id":"c1","total":10}`), abi.Metadata{})
	require.NoError(t, err)
	res, err := e.Dispatch(ctx, "Intrude", json.RawMessage(`{"op":"dispatch","id":"o1"}`), abi.Metadata{})
	require.NoError(t, err)
	require.Len(t, res.Dispatched, 1)
	require.Empty(t, res.Dispatched[0].Error)
}
