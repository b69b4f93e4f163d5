package record_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/proteanhq/protean-host/record"
	"github.com/proteanhq/protean-host/record/storetest"
)

// memoryTx adapts *record.MemoryTx to storetest.Tx.
type memoryTx struct{ *record.MemoryTx }

func (tx memoryTx) Commit(context.Context) error   { return tx.MemoryTx.Commit() }
func (tx memoryTx) Rollback(context.Context) error { tx.MemoryTx.Rollback(); return nil }

func TestMemoryConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		m := record.NewMemory()
		return storetest.Harness{
			Store: m,
			Begin: func(context.Context) (storetest.Tx, error) { return memoryTx{m.Begin()}, nil },
		}
	})
}

func ExampleMemory_Begin() {
	ctx := context.Background()
	store := record.NewMemory()
	key := record.Key{Kind: record.KindAggregate, Type: "order", ID: "o-1"}

	tx := store.Begin()
	_ = tx.Write(ctx, []record.Write{{Key: key, ExpectedVersion: 0, Data: []byte(`{"status":"placed"}`)}})
	inTx, _ := tx.Load(ctx, key)
	outside, _ := store.Load(ctx, key)
	_ = tx.Commit()
	fmt.Println(inTx.Version, outside.Version)

	err := store.Commit(ctx, []record.Write{{Key: key, ExpectedVersion: 0, Data: []byte(`{}`)}})
	fmt.Println(errors.Is(err, record.ErrExpectedVersion), err)
	// Output:
	// 1 0
	// true record aggregate/order/o-1: expected version 0, actual 1
}
