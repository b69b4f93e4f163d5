package eventstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/eventstore/storetest"
)

// memoryTx adapts *eventstore.MemoryTx to storetest.Tx.
type memoryTx struct{ *eventstore.MemoryTx }

func (tx memoryTx) Commit(context.Context) error   { return tx.MemoryTx.Commit() }
func (tx memoryTx) Rollback(context.Context) error { tx.MemoryTx.Rollback(); return nil }

func TestMemoryConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		m := eventstore.NewMemory(nil)
		return storetest.Harness{
			Store: m,
			Begin: func(context.Context) (storetest.Tx, error) { return memoryTx{m.Begin()}, nil },
		}
	})
}

func TestMemoryClock(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 8, 21, 12, 0, 0, 123456789, time.FixedZone("CEST", 2*3600))
	m := eventstore.NewMemory(func() time.Time { return at })
	out, err := m.Append(t.Context(), []eventstore.NewEvent{{Stream: "order-1", Type: "A", ExpectedVersion: eventstore.NoStream}})
	require.NoError(t, err)
	require.Equal(t, time.Date(2026, 8, 21, 10, 0, 0, 123456000, time.UTC), out[0].Time, "UTC, to the microsecond")
}

func TestCategory(t *testing.T) {
	t.Parallel()
	for stream, want := range map[string]string{
		"order-1":       "order",
		"orders-1":      "orders",
		"order-a-b":     "order",
		"order:cmd-1":   "order:cmd",
		"order":         "order",
		"-1":            "",
		"":              "",
		"order-":        "order",
		"test::order-9": "test::order",
	} {
		require.Equal(t, want, eventstore.Category(stream), stream)
	}
}

func TestNewID(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		id := eventstore.NewID()
		require.Regexp(t, `^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`, id)
		require.False(t, seen[id])
		seen[id] = true
	}
}

func ExampleMemory_Begin() {
	ctx := context.Background()
	store := eventstore.NewMemory(nil)

	tx := store.Begin()
	_, err := tx.Append(ctx, []eventstore.NewEvent{
		{Stream: "order-1", Type: "OrderPlaced", Data: []byte(`{"total":10}`), ExpectedVersion: eventstore.NoStream},
	})
	if err != nil {
		tx.Rollback()
		return
	}
	before, _ := store.StreamVersion(ctx, "order-1")
	_ = tx.Commit()
	after, _ := store.StreamVersion(ctx, "order-1")
	fmt.Println(before, after)

	_, err = store.Append(ctx, []eventstore.NewEvent{
		{Stream: "order-1", Type: "OrderPlaced", ExpectedVersion: eventstore.NoStream},
	})
	fmt.Println(err)
	// Output:
	// -1 0
	// eventstore: stream order-1: expected version -1, actual 0
}
