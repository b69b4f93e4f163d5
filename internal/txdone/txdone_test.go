package txdone_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/txdone"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/position"
	"github.com/proteanhq/protean-host/record"
)

func TestClosed(t *testing.T) {
	t.Parallel()
	require.True(t, txdone.Closed(txdone.Err))
	require.True(t, txdone.Closed(fmt.Errorf("commit: %w", pgx.ErrTxClosed)))
	require.False(t, txdone.Closed(errors.New("other")))
	require.False(t, txdone.Closed(nil))
}

// Every store's ErrTxDone is the one sentinel, so errors.Is holds across
// stores (a unit of work tests once).
func TestStoresShareTheSentinel(t *testing.T) {
	t.Parallel()
	for _, err := range []error{eventstore.ErrTxDone, record.ErrTxDone, outbox.ErrTxDone, position.ErrTxDone} {
		require.ErrorIs(t, err, txdone.Err)
		require.ErrorIs(t, record.ErrTxDone, err)
	}
}
