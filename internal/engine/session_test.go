package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/host"
)

func timeoutCall() error {
	return &host.CallError{File: "m.wasm", Handler: "h", Err: fmt.Errorf("%w (limit 800ms)", host.ErrTimeout)}
}

// A call that runs out of time is the store's doing only when the store
// stalled: store calls of at least the stall share of the deadline count
// towards storeWait, quicker ones (a guest's thousands of loads, its pages
// of a long stream) do not, however many. And a quick store call the
// call's own deadline cut is no store failure: a guest that reads until its
// deadline would otherwise be retried as an outage without end; a call the
// database held until the deadline is one.
func TestAGuestsOwnReadsAreNotAnOutage(t *testing.T) {
	const timeout = 800 * time.Millisecond
	s := &session{stall: timeout / stallShare}
	for range 1000 {
		s.waited(time.Now().Add(-timeout / 40))
	}
	require.Zero(t, s.storeWait, "quick store calls are the guest's own time")
	kind, _ := callFailure(timeoutCall(), s.storeWait, s.storeFailed, timeout)
	require.Equal(t, abi.ErrorPermanent, kind)

	s.waited(time.Now().Add(-timeout / 2))
	require.GreaterOrEqual(t, s.storeWait, timeout/2, "a stalled store call counts")
	kind, err := callFailure(timeoutCall(), s.storeWait, s.storeFailed, timeout)
	require.Equal(t, abi.ErrorTransient, kind)
	require.Equal(t, delivery.Infrastructure, Classify(err))

	cut, cancel := context.WithCancel(context.Background())
	cancel()
	s = &session{stall: timeout / stallShare}
	require.Equal(t, abi.HostTransient, s.storeErrorKind(cut, errDown, timeout/40))
	require.NoError(t, s.storeFailed, "a quick read the call's deadline cut is not a store failure")
	require.Equal(t, abi.HostTransient, s.storeErrorKind(cut, errDown, timeout/2))
	require.ErrorIs(t, s.storeFailed, errDown, "a read the database held until the deadline is")
	s = &session{stall: timeout / stallShare}
	require.Equal(t, abi.HostTransient, s.storeErrorKind(context.Background(), errDown, 0))
	require.ErrorIs(t, s.storeFailed, errDown, "a database that is down is")
}
