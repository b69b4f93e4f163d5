package host

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// A host function called after its call's deadline does no work: it
// answers an error (the guest is about to be stopped), unless the module
// is uninterruptible, whose calls run to their end. It still counts.
func TestHostCallsAfterTheDeadlineDoNoWork(t *testing.T) {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	b := &callBudget{lim: DefaultLimits()}
	require.NoError(t, b.enter(context.Background(), "load"))
	require.ErrorIs(t, b.enter(done, "load"), errDeadlinePassed)
	require.ErrorIs(t, b.enter(done, "load"), context.Canceled)
	require.Equal(t, 3, b.calls)

	trusted := DefaultLimits()
	trusted.Uninterruptible = true
	b = &callBudget{lim: trusted}
	require.NoError(t, b.enter(done, "load"))
}
