package unitofwork_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/record"
)

type keys map[string]string

func (k keys) PartitionField(c string) (string, bool) { f, ok := k[c]; return f, ok }

func newUoW(t *testing.T) (*unitofwork.UnitOfWork, *unitofwork.Memory) {
	t.Helper()
	mem := unitofwork.NewMemory()
	return unitofwork.New(mem, unitofwork.Options{Keys: keys{"order": "client_id"}, Broker: "default", MaxRetries: 3}), mem
}

func placeOrder(orderID, clientJSON string) *abi.Effects {
	noStream := abi.NoStream
	return &abi.Effects{
		Writes: []abi.Write{{Kind: abi.RecordAggregate, Type: "order", ID: orderID, ExpectedVersion: 0, Data: json.RawMessage(`{"status": "placed"}`)}},
		Events: []abi.NewEvent{{Stream: "order-" + orderID, Type: "OrderPlaced", ExpectedVersion: &noStream,
			Data: json.RawMessage(`{"order_id": "` + orderID + `", "client_id": ` + clientJSON + `}`)}},
	}
}

// nothingStored asserts the stores hold no event, no outbox row and no
// record for order id.
func nothingStored(t *testing.T, mem *unitofwork.Memory, id string) {
	t.Helper()
	ctx := context.Background()
	evs, err := mem.Events.ReadAll(ctx, 1, 100)
	require.NoError(t, err)
	require.Empty(t, evs)
	st, err := mem.Outbox.Stats(ctx)
	require.NoError(t, err)
	for status, n := range st.Counts {
		require.Zero(t, n, "outbox rows in %s", status)
	}
	rec, err := mem.Records.Load(ctx, record.Key{Kind: "aggregate", Type: "order", ID: id})
	require.NoError(t, err)
	require.Zero(t, rec.Version)
}

func TestCommitWritesAllThree(t *testing.T) {
	u, mem := newUoW(t)
	ctx := context.Background()
	c, err := u.Commit(ctx, unitofwork.Change{Effects: placeOrder("o-1", `7`), Metadata: abi.Metadata{CorrelationID: "corr"}})
	require.NoError(t, err)
	require.Len(t, c.Events, 1)
	require.Equal(t, int64(0), c.Events[0].Position)

	rows, err := mem.Outbox.Claim(ctx, "default", "test", 10, 0)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, "7", *rows[0].PartitionKey, "a number key is coerced to its JSON text")
	require.Equal(t, "order", rows[0].Category)
	require.Equal(t, c.Events[0].ID, rows[0].MessageID)
	require.Equal(t, "default", rows[0].TargetBroker)
	require.Contains(t, string(rows[0].Metadata), `"correlation_id":"corr"`)

	rec, err := mem.Records.Load(ctx, record.Key{Kind: "aggregate", Type: "order", ID: "o-1"})
	require.NoError(t, err)
	require.Equal(t, int64(1), rec.Version)
}

func TestRejectedKeyStoresNothing(t *testing.T) {
	for _, tc := range []struct{ name, client, reason string }{
		{"colon", `"a:b"`, "contains a colon"},
		{"dlq", `"dlq"`, "reserved lane/DLQ token"},
		{"backfill", `"backfill"`, "reserved lane/DLQ token"},
		{"sentinel", `"__x__"`, "reserved '__name__' sentinel form"},
		{"empty", `""`, "null or empty"},
		{"null", `null`, "null or empty"},
		{"too long", `"` + strings.Repeat("k", 256) + `"`, "exceeds 255 characters (got 256)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, mem := newUoW(t)
			_, err := u.Commit(context.Background(), unitofwork.Change{Effects: placeOrder("o-1", tc.client)})
			var ke *unitofwork.KeyError
			require.ErrorAs(t, err, &ke)
			require.ErrorIs(t, err, partition.ErrInvalidKey)
			require.Equal(t, "order", ke.Category)
			require.Equal(t, "client_id", ke.Field)
			require.Contains(t, err.Error(), "invalid sequential_by key on order (field client_id of OrderPlaced)")
			require.Contains(t, err.Error(), tc.reason)
			nothingStored(t, mem, "o-1")
		})
	}
	t.Run("missing field", func(t *testing.T) {
		u, mem := newUoW(t)
		e := placeOrder("o-1", `"c"`)
		e.Events[0].Data = json.RawMessage(`{"order_id": "o-1"}`)
		_, err := u.Commit(context.Background(), unitofwork.Change{Effects: e})
		require.ErrorContains(t, err, "null or empty")
		nothingStored(t, mem, "o-1")
	})
}

func TestConflictStoresNothing(t *testing.T) {
	ctx := context.Background()
	t.Run("stream conflict after a record write", func(t *testing.T) {
		u, mem := newUoW(t)
		_, err := mem.Events.Append(ctx, []eventstore.NewEvent{{Stream: "order-o-1", Type: "Other", Data: json.RawMessage(`{}`), ExpectedVersion: eventstore.AnyVersion}})
		require.NoError(t, err)
		_, err = u.Commit(ctx, unitofwork.Change{Effects: placeOrder("o-1", `"c-1"`)})
		require.True(t, unitofwork.Conflict(err), "%v", err)
		rec, err := mem.Records.Load(ctx, record.Key{Kind: "aggregate", Type: "order", ID: "o-1"})
		require.NoError(t, err)
		require.Zero(t, rec.Version, "the record write rolled back with the append")
		st, err := mem.Outbox.Stats(ctx)
		require.NoError(t, err)
		require.Zero(t, st.Counts[outbox.StatusPending])
	})
	t.Run("record conflict", func(t *testing.T) {
		u, mem := newUoW(t)
		_, err := u.Commit(ctx, unitofwork.Change{Effects: placeOrder("o-1", `"c-1"`)})
		require.NoError(t, err)
		e := placeOrder("o-1", `"c-1"`)
		e.Events[0].Stream = "order-o-2"
		_, err = u.Commit(ctx, unitofwork.Change{Effects: e})
		require.True(t, unitofwork.Conflict(err))
		require.False(t, errors.Is(err, partition.ErrInvalidKey))
		v, err := mem.Events.StreamVersion(ctx, "order-o-2")
		require.NoError(t, err)
		require.Equal(t, int64(-1), v)
	})
}

func TestUnpartitionedAndEmpty(t *testing.T) {
	u, mem := newUoW(t)
	ctx := context.Background()
	c, err := u.Commit(ctx, unitofwork.Change{Effects: &abi.Effects{Commands: []abi.NewCommand{{Type: "ShipOrder", Data: json.RawMessage(`{}`)}}}})
	require.NoError(t, err)
	require.Len(t, c.Commands, 1)
	_, err = u.Commit(ctx, unitofwork.Change{Effects: &abi.Effects{Events: []abi.NewEvent{{Stream: "payment-p-1", Type: "PaymentRecorded", Data: json.RawMessage(`{"order_id": "a:b"}`)}}}})
	require.NoError(t, err, "an unpartitioned category takes any data")
	rows, err := mem.Outbox.Claim(ctx, "default", "test", 10, 0)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Nil(t, rows[0].PartitionKey)
}
