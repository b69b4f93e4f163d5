package local_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/ops"
	"github.com/proteanhq/protean-host/internal/ops/local"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/position"
)

// rig is a Service over memory stores with two tenants: shop (handler
// client_orders, category order) and lab (handler behave, category lab).
type rig struct {
	svc      *local.Service
	outbox   *outbox.Memory
	failures *subscription.MemoryFailures
	audit    *audit.Memory
}

func newRig(t *testing.T) rig {
	t.Helper()
	positions := position.NewMemory(nil)
	r := rig{outbox: outbox.NewMemory(nil), failures: &subscription.MemoryFailures{Positions: positions}, audit: audit.NewMemory(nil)}
	tenancy := ops.Tenancy{Handlers: map[string]string{"client_orders": "shop", "behave": "lab"}, Owner: func(c string) string {
		return map[string]string{"order": "shop", "lab": "lab"}[c]
	}}
	subs := []subscription.Subscription{{Group: "client_orders", Category: "order"}, {Group: "behave", Category: "lab"}}
	var err error
	r.svc, err = local.New(local.Options{Tenancy: func() ops.Tenancy { return tenancy }, Outbox: r.outbox, Audit: r.audit,
		Subscriptions: func() []subscription.Subscription { return subs }, Positions: positions,
		Leases: &subscription.MemoryLeases{}, Head: func(context.Context, string) (int64, error) { return 7, nil }, Failures: r.failures})
	require.NoError(t, err)
	return r
}

// abandoned adds an abandoned outbox row of category and returns its id.
func (r rig) abandoned(t *testing.T, category, id string) int64 {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, r.outbox.Add(ctx, []outbox.Row{{MessageID: id, Stream: category + "-1", Category: category, Type: "T",
		Data: []byte(`{}`), TargetBroker: "default"}}))
	st, err := r.outbox.Stats(ctx)
	require.NoError(t, err)
	var n int64
	for _, s := range st.Counts {
		n += int64(s)
	}
	require.NoError(t, r.outbox.Abandon(ctx, n, "broker refused"))
	return n
}

func TestOutboxIsScopedToTheTenant(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	shopRow, labRow := r.abandoned(t, "order", "m-1"), r.abandoned(t, "lab", "m-2")
	shop, lab := ops.Tenants("shop"), ops.Tenants("lab")

	ob, err := r.svc.Outbox(ctx, shop)
	require.NoError(t, err)
	require.Len(t, ob.Rows, 1)
	require.Equal(t, shopRow, ob.Rows[0].ID)
	require.Equal(t, "shop", ob.Rows[0].Tenant)
	require.Nil(t, ob.Counts, "counts are the whole host's: an admin's")
	all, err := r.svc.Outbox(ctx, ops.All())
	require.NoError(t, err)
	require.Len(t, all.Rows, 2)
	require.Equal(t, 2, all.Counts["abandoned"])

	// Another tenant's row and a row that does not exist look the same.
	_, err = r.svc.ActOnOutbox(ctx, lab, ops.Act{Action: "retry", By: "key:lab"}, shopRow)
	require.ErrorIs(t, err, ops.ErrForbidden)
	_, err = r.svc.ActOnOutbox(ctx, lab, ops.Act{Action: "retry", By: "key:lab"}, 999)
	require.ErrorIs(t, err, ops.ErrForbidden)
	_, err = r.svc.ActOnOutbox(ctx, ops.All(), ops.Act{Action: "retry", By: "cli:root"}, 999)
	require.ErrorIs(t, err, ops.ErrNotFound, "an admin is told")
	_, err = r.svc.ActOnOutbox(ctx, lab, ops.Act{Action: "drop", By: "key:lab"}, labRow)
	require.ErrorIs(t, err, ops.ErrInvalid)

	d, err := r.svc.ActOnOutbox(ctx, shop, ops.Act{Action: "retry", By: "key:shop", Reason: "broker fixed"}, shopRow)
	require.NoError(t, err)
	require.Equal(t, "shop", d.Tenant)
	row, err := r.outbox.Get(ctx, shopRow)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusPending, row.Status)
	// A pending row cannot be skipped; the refusal is recorded too.
	_, err = r.svc.ActOnOutbox(ctx, shop, ops.Act{Action: "skip", By: "key:shop"}, shopRow)
	require.ErrorIs(t, err, ops.ErrConflict)

	es, err := r.svc.Audit(ctx, shop, audit.Query{})
	require.NoError(t, err)
	require.Len(t, es, 2, "the retry and the refused skip; none of the refusals outside the scope")
	require.Equal(t, "outbox.skip", es[0].Action)
	require.Contains(t, es[0].Outcome, "only a halted or failed row can be skipped")
	require.Equal(t, audit.Entry{ID: d.Audit, At: es[1].At, Principal: "key:shop", Tenant: "shop", Action: "outbox.retry",
		Target: d.Target, Outcome: audit.OK, Reason: "broker fixed"}, es[1])
	es, err = r.svc.Audit(ctx, lab, audit.Query{})
	require.NoError(t, err)
	require.Empty(t, es)
}

func TestFailuresAreScopedToTheTenant(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	now := time.Now()
	for _, f := range []subscription.Failure{
		{Group: "client_orders", Unit: "order", GlobalPosition: 3, Status: subscription.StatusFailed, Type: "OrderPlaced", Error: "boom", FailedAt: now},
		{Group: "behave", Unit: "lab", GlobalPosition: 4, Status: subscription.StatusFailed, Type: "Incremented", Error: "boom", FailedAt: now},
		{Group: "removed", Unit: "lab", GlobalPosition: 5, Status: subscription.StatusFailed, Type: "Incremented", Error: "boom", FailedAt: now},
	} {
		require.NoError(t, r.failures.Record(ctx, f))
	}
	shop := ops.Tenants("shop")
	fs, err := r.svc.Failures(ctx, shop, false)
	require.NoError(t, err)
	require.Len(t, fs, 1)
	require.Equal(t, ops.Failure{Tenant: "shop", Group: "client_orders", Unit: "order", Position: 3, Status: "failed", Type: "OrderPlaced",
		Error: "boom", FailedAt: fs[0].FailedAt}, fs[0])
	all, err := r.svc.Failures(ctx, ops.All(), false)
	require.NoError(t, err)
	require.Len(t, all, 3, "a removed handler's record is an admin's")

	subs, err := r.svc.Subscriptions(ctx, shop)
	require.NoError(t, err)
	require.Equal(t, []ops.Subscription{{Tenant: "shop", Group: "client_orders", Unit: "order", Head: 7, Lag: 7, OpenFailures: 1}}, subs)

	_, err = r.svc.ActOnFailure(ctx, shop, ops.Act{Action: "retry", By: "key:shop"}, "behave", "lab", 4)
	require.ErrorIs(t, err, ops.ErrForbidden)
	_, err = r.svc.ActOnFailure(ctx, shop, ops.Act{Action: "retry", By: "key:shop"}, "removed", "lab", 5)
	require.ErrorIs(t, err, ops.ErrForbidden)
	_, err = r.svc.ActOnFailure(ctx, shop, ops.Act{Action: "retry", By: "key:shop"}, "client_orders", "order", 0)
	require.ErrorIs(t, err, ops.ErrInvalid)
	_, err = r.svc.ActOnFailure(ctx, shop, ops.Act{Action: "retry", By: "key:shop"}, "client_orders", "order", 9)
	require.ErrorIs(t, err, ops.ErrNotFound, "the tenant's own group: told there is no such record")
	d, err := r.svc.ActOnFailure(ctx, shop, ops.Act{Action: "retry", By: "key:shop"}, "client_orders", "order", 3)
	require.NoError(t, err)
	require.Equal(t, "client_orders/order@3", d.Target)
	_, err = r.svc.ActOnFailure(ctx, shop, ops.Act{Action: "retry", By: "key:shop"}, "client_orders", "order", 3)
	require.ErrorIs(t, err, ops.ErrConflict, "already marked for retry")
	es, err := r.svc.Audit(ctx, ops.All(), audit.Query{})
	require.NoError(t, err)
	require.Len(t, es, 3)
	require.Equal(t, []string{"subscriptions.retry"}, []string{es[0].Action})
	require.Equal(t, audit.OK, es[1].Outcome)
}

func TestNoPartitionsOnThisHost(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	ps, err := r.svc.Partitions(ctx, ops.Tenants("shop"))
	require.NoError(t, err)
	require.Empty(t, ps)
	_, err = r.svc.Partition(ctx, ops.Tenants("shop"), "order", "c-1")
	require.ErrorIs(t, err, ops.ErrForbidden)
	_, err = r.svc.ActOnPartition(ctx, ops.All(), ops.Act{Action: "resume"}, "order", "c-1", "")
	require.ErrorIs(t, err, ops.ErrNotFound)
}

func TestScope(t *testing.T) {
	require.True(t, ops.All().Has(""))
	require.True(t, ops.All().Has("shop"))
	require.True(t, ops.Tenants("shop").Has("shop"))
	require.False(t, ops.Tenants("shop").Has("lab"))
	require.False(t, ops.Tenants("shop").Has(""), "an item no tenant owns is an admin's")
	require.False(t, ops.Tenants().Has("shop"))
}
