package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/outbox/storetest"
	"github.com/proteanhq/protean-host/position"
)

// memoryTx adapts *outbox.MemoryTx to storetest.Tx.
type memoryTx struct{ *outbox.MemoryTx }

func (tx memoryTx) Commit(context.Context) error   { return tx.MemoryTx.Commit() }
func (tx memoryTx) Rollback(context.Context) error { tx.MemoryTx.Rollback(); return nil }

func TestMemoryConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T, now func() time.Time) storetest.Harness {
		m, positions := outbox.NewMemory(now), position.NewMemory(now)
		m.ReadPositions(positions)
		return storetest.Harness{
			Store: m, Positions: positions,
			Begin: func(context.Context) (storetest.Tx, error) { return memoryTx{m.Begin()}, nil },
		}
	})
}

func ExampleMemory_Claim() {
	ctx := context.Background()
	now := time.Date(2026, 8, 21, 9, 0, 0, 0, time.UTC)
	store := outbox.NewMemory(func() time.Time { return now })

	tx := store.Begin()
	_ = tx.Add(ctx, []outbox.Row{
		{MessageID: "m-1", Stream: "order-o-1", Type: "OrderPlaced", TargetBroker: "default"},
		{MessageID: "m-2", Stream: "order-o-2", Type: "OrderPlaced", TargetBroker: "default", Priority: 1},
	})
	_ = tx.Commit()

	rows, _ := store.Claim(ctx, "default", "relay-1", 10, time.Minute)
	for _, r := range rows {
		fmt.Println(r.ID, r.MessageID, r.Category, r.Status, r.LockedUntil.Format(time.TimeOnly))
	}
	fmt.Println(store.MarkPublished(ctx, rows[0].ID, "relay-2"))
	// Output:
	// 2 m-2 order processing 09:01:00
	// 1 m-1 order processing 09:01:00
	// outbox row 2: processing, locked by "relay-1", not "relay-2": outbox row not locked by this owner
}
