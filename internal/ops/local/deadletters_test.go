package local_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/groups"
	"github.com/proteanhq/protean-host/internal/ops"
	"github.com/proteanhq/protean-host/internal/ops/local"
	"github.com/proteanhq/protean-host/outbox"
)

// dead publishes a message with id to stream and has group give up on it
// (no retries: the first nack dead-letters it).
func dead(t *testing.T, b *broker.Inline, stream, group, id string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, b.Publish(ctx, delivery.Message{ID: id, Stream: stream, Type: "T", Data: json.RawMessage(`{"id":"` + id + `"}`)}))
	d, err := b.Next(ctx, stream, group)
	require.NoError(t, err)
	require.Equal(t, id, d.ID)
	require.NoError(t, b.Nack(ctx, stream, group, id))
}

// handlerTenancy places shop's handler client_orders and lab's behave.
func handlerTenancy() ops.Tenancy {
	return ops.Tenancy{Handlers: map[string]string{"client_orders": "shop", "behave": "lab"}, Owner: func(string) string { return "" }}
}

// deadLetterRig is a Service over an inline broker whose running groups
// are shop's client_orders on order and lab's behave on lab.
func deadLetterRig(t *testing.T) (*local.Service, *broker.Inline, *audit.Memory) {
	t.Helper()
	opts := broker.DefaultOptions()
	opts.MaxRetries = 0
	b, err := broker.NewInline(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	log := audit.NewMemory(nil)
	svc, err := local.New(local.Options{Tenancy: handlerTenancy, Outbox: outbox.NewMemory(nil), Audit: log,
		DeadLetters: b, Groups: func() []groups.Group {
			return []groups.Group{{Handler: "client_orders", Stream: "order"}, {Handler: "behave", Stream: "lab"}}
		}})
	require.NoError(t, err)
	return svc, b, log
}

func TestDeadLettersAreScopedToTheTenant(t *testing.T) {
	ctx := context.Background()
	svc, b, log := deadLetterRig(t)
	dead(t, b, "order", "client_orders", "m-1")
	dead(t, b, "lab", "behave", "m-2")
	shop, lab := ops.Tenants("shop"), ops.Tenants("lab")

	dls, err := svc.DeadLetters(ctx, shop)
	require.NoError(t, err)
	require.Equal(t, []ops.DeadLetter{{Tenant: "shop", Group: "client_orders", Stream: "order", ID: "m-1", Type: "T", Reason: broker.ReasonMaxRetries,
		Attempts: 1, FailedAt: dls[0].FailedAt, Source: "group", Replayable: true, Data: `{"id":"m-1"}`}}, dls)
	all, err := svc.DeadLetters(ctx, ops.All())
	require.NoError(t, err)
	require.Len(t, all, 2)

	// Another tenant's dead letter and one that does not exist look the same.
	act := ops.Act{Action: "replay", By: "key:lab"}
	_, err = svc.ReplayDeadLetter(ctx, lab, act, "order", "client_orders", "m-1")
	require.ErrorIs(t, err, ops.ErrForbidden)
	_, err = svc.ReplayDeadLetter(ctx, lab, act, "order", "nobody", "m-9")
	require.ErrorIs(t, err, ops.ErrForbidden)
	_, err = svc.ReplayDeadLetter(ctx, ops.All(), ops.Act{Action: "replay", By: "cli:root"}, "order", "nobody", "m-9")
	require.ErrorIs(t, err, ops.ErrNotFound, "an admin is told")
	_, err = svc.ReplayDeadLetter(ctx, lab, ops.Act{Action: "skip", By: "key:lab"}, "lab", "behave", "m-2")
	require.ErrorIs(t, err, ops.ErrInvalid)
	_, err = svc.ReplayDeadLetter(ctx, lab, act, "lab", "behave", "m-9")
	require.ErrorIs(t, err, ops.ErrNotFound, "the tenant's own group: told there is no such dead letter")

	d, err := svc.ReplayDeadLetter(ctx, shop, ops.Act{Action: "replay", By: "key:shop", Reason: "bug fixed"}, "order", "client_orders", "m-1")
	require.NoError(t, err)
	require.Equal(t, "shop", d.Tenant)
	again, err := b.Next(ctx, "order", "client_orders")
	require.NoError(t, err, "the replayed message is delivered again")
	require.Equal(t, "m-1", again.ID)
	require.Equal(t, 1, again.Attempt)
	dls, err = svc.DeadLetters(ctx, shop)
	require.NoError(t, err)
	require.Empty(t, dls)

	es, err := svc.Audit(ctx, shop, audit.Query{})
	require.NoError(t, err)
	require.Equal(t, []audit.Entry{{ID: d.Audit, At: es[0].At, Principal: "key:shop", Tenant: "shop", Action: "deadletters.replay",
		Target: "order client_orders m-1", Outcome: audit.OK, Reason: "bug fixed"}}, es)
	es, err = svc.Audit(ctx, lab, audit.Query{})
	require.NoError(t, err)
	require.Len(t, es, 1, "the replay of a dead letter lab's group does not have; none of the refusals outside the scope")
	require.Contains(t, es[0].Outcome, "not in dead-letter queue")
	es, err = log.List(ctx, audit.Query{})
	require.NoError(t, err)
	require.Len(t, es, 3, "and the admin's")
}

func TestDeadLettersListAtMostMaxOfAStream(t *testing.T) {
	ctx := context.Background()
	svc, b, _ := deadLetterRig(t)
	for i := range ops.MaxDeadLetters + 1 {
		dead(t, b, "order", "client_orders", fmt.Sprintf("m-%03d", i))
	}
	dls, err := svc.DeadLetters(ctx, ops.All())
	require.NoError(t, err)
	require.Len(t, dls, ops.MaxDeadLetters)
	require.Equal(t, "m-000", dls[0].ID, "the oldest")
}

func TestNoDeadLettersOnThisHost(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	dls, err := r.svc.DeadLetters(ctx, ops.Tenants("shop"))
	require.NoError(t, err)
	require.Empty(t, dls)
	_, err = r.svc.ReplayDeadLetter(ctx, ops.Tenants("shop"), ops.Act{Action: "replay"}, "order", "client_orders", "m-1")
	require.ErrorIs(t, err, ops.ErrNotFound)
}
