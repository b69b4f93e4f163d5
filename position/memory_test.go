package position_test

import (
	"context"
	"testing"
	"time"

	"github.com/proteanhq/protean-host/position"
	"github.com/proteanhq/protean-host/position/positiontest"
)

// memoryTx adapts *position.MemoryTx to positiontest.Tx.
type memoryTx struct{ *position.MemoryTx }

func (tx memoryTx) Commit(context.Context) error   { return tx.MemoryTx.Commit() }
func (tx memoryTx) Rollback(context.Context) error { tx.MemoryTx.Rollback(); return nil }

func TestMemoryConformance(t *testing.T) {
	t.Parallel()
	positiontest.Run(t, func(t *testing.T, now func() time.Time) positiontest.Harness {
		m := position.NewMemory(now)
		return positiontest.Harness{
			Store: m,
			Begin: func(context.Context) (positiontest.Tx, error) { return memoryTx{m.Begin()}, nil },
		}
	})
}
