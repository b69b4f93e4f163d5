package local_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/groups"
	"github.com/proteanhq/protean-host/internal/ops"
	"github.com/proteanhq/protean-host/internal/ops/local"
	"github.com/proteanhq/protean-host/internal/redisstream"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/outbox"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// TestPartitionDeadLettersAreListedNotReplayed: on Redis the listing
// finds a partition's DLQ stream (as partitions dlq writes it) beside the
// groups' without being told of it; its dead letter is the group's
// tenant's, not replayable, and a replay is refused as a conflict.
func TestPartitionDeadLettersAreListedNotReplayed(t *testing.T) {
	ctx := context.Background()
	url, prefix := testserver.Redis(t)
	o, err := redis.ParseURL(url)
	require.NoError(t, err)
	rdb := redis.NewClient(o)
	t.Cleanup(func() { _ = rdb.Close() })
	opts := broker.DefaultOptions()
	opts.MaxRetries = 0
	b, err := redisstream.New(rdb, redisstream.Options{Options: opts, Prefix: prefix, Consumer: "test"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })

	require.NoError(t, b.Publish(ctx, delivery.Message{ID: "m-1", Stream: "order", Type: "Placed", Data: []byte(`{}`)}))
	d, err := b.Next(ctx, "order", "client_orders")
	require.NoError(t, err)
	require.NoError(t, b.Nack(ctx, "order", "client_orders", d.ID))
	require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: prefix + "order:c-1:dlq", Values: []any{"id", "k-1", "type", "Placed",
		"data", `{"n":1}`, "global_position", "12", "dl_group", "client_orders", "dl_reason", "max_retries", "dl_attempts", "3",
		"dl_failed_at", "1700000000 0", "dl_entry", "1-0", "dl_stream", "order:c-1", "dl_unit", "order:c-1"}}).Err())

	svc, err := local.New(local.Options{Tenancy: handlerTenancy, Outbox: outbox.NewMemory(nil), Audit: audit.NewMemory(nil),
		DeadLetters: b, Groups: func() []groups.Group { return []groups.Group{{Handler: "client_orders", Stream: "order"}} }})
	require.NoError(t, err)

	dls, err := svc.DeadLetters(ctx, ops.Tenants("shop"))
	require.NoError(t, err)
	require.Len(t, dls, 2)
	require.Equal(t, ops.DeadLetter{Tenant: "shop", Group: "client_orders", Stream: "order:c-1", ID: "k-1", Type: "Placed", GlobalPosition: 12,
		Reason: "max_retries", Attempts: 3, FailedAt: dls[1].FailedAt, Source: "partition", Data: `{"n":1}`}, dls[1])
	require.Equal(t, "group", dls[0].Source)
	require.True(t, dls[0].Replayable)
	lab, err := svc.DeadLetters(ctx, ops.Tenants("lab"))
	require.NoError(t, err)
	require.Empty(t, lab)

	shop := ops.Act{Action: "replay", By: "key:shop"}
	_, err = svc.ReplayDeadLetter(ctx, ops.Tenants("shop"), shop, "order:c-1", "client_orders", "k-1")
	require.ErrorIs(t, err, ops.ErrConflict)
	require.ErrorContains(t, err, "replayed by hand")
	_, err = svc.ReplayDeadLetter(ctx, ops.Tenants("lab"), ops.Act{Action: "replay", By: "key:lab"}, "order:c-1", "client_orders", "k-1")
	require.ErrorIs(t, err, ops.ErrForbidden)
	_, err = svc.ReplayDeadLetter(ctx, ops.Tenants("shop"), shop, "order", "client_orders", "m-1")
	require.NoError(t, err)
	again, err := b.Next(ctx, "order", "client_orders")
	require.NoError(t, err)
	require.Equal(t, "m-1", again.ID)
}
