package unitofwork_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/unitofwork"
)

// The memory backend's Begin honours its context: done before, it
// refuses; ending while Begin waits for another unit's locks, it gives up;
// and the locks it would have taken are released, not leaked.
func TestMemoryBeginHonoursItsContext(t *testing.T) {
	mem := unitofwork.NewMemory()
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := mem.Begin(canceled)
	require.ErrorIs(t, err, context.Canceled)

	held, err := mem.Begin(context.Background())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = mem.Begin(ctx) // waits for held's locks until ctx ends
	require.ErrorIs(t, err, context.DeadlineExceeded)

	require.NoError(t, held.Rollback(context.Background()))
	// The abandoned Begin's goroutine gets the locks and lets them go, so
	// a later unit of work begins.
	next := make(chan error, 1)
	go func() {
		tx, err := mem.Begin(testwait.Context(t))
		if err == nil {
			err = tx.Rollback(context.Background())
		}
		next <- err
	}()
	require.NoError(t, testwait.Recv(t, "a unit of work to begin after the abandoned one", next))
}
