package engine

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/delivery"
)

// TestCascadeDepthTravelsWithMessages: the depth is written into the
// metadata of the events a command appends, read back from a delivered
// message, and one step deeper in what that message causes; so a cascade
// that goes through the store and the broker keeps counting.
func TestCascadeDepthTravelsWithMessages(t *testing.T) {
	e, _ := newEngine(t)
	ctx := context.Background()
	_, err := e.Dispatch(ctx, "Increment", json.RawMessage(`{"id":"x"}`), abi.Metadata{CascadeDepth: 99})
	require.NoError(t, err, "a command from outside begins a chain, whatever its metadata claims")
	evs, err := e.opts.Events.ReadStream(ctx, "counter-x", 0, 0)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	var md abi.Metadata
	require.NoError(t, json.Unmarshal(evs[0].Metadata, &md))
	require.Equal(t, 1, md.CascadeDepth)

	env := e.messageEnvelope(delivery.Message{ID: "m", Type: "Op", Metadata: json.RawMessage(`{"correlation_id":"c","cascade_depth":5}`)})
	require.Equal(t, 5, depth(env))
	require.Equal(t, abi.Metadata{CorrelationID: "c", CausationID: "m", CascadeDepth: 6}, caused(env))
}

// TestCascadeBudgetFailsTheMessage: a delivered message at the chain's
// maximum depth that appends an event fails, permanently, naming the
// budget; below it, it succeeds; a message without follow-ups is never
// refused (a projection at the end of a long chain still updates).
func TestCascadeBudgetFailsTheMessage(t *testing.T) {
	e, _ := newEngine(t)
	l := e.loaded.Load()
	route := l.set.Subscribers("Op")[0]
	op := func(name string, d int) abi.Envelope {
		return abi.Envelope{ID: "1", Type: "Op", Data: json.RawMessage(`{"op":"` + name + `","id":"x","arg":"ops-x"}`),
			Metadata: &abi.Metadata{CorrelationID: "origin", CascadeDepth: d}}
	}
	res, err := e.call(context.Background(), l, route, []abi.Envelope{op("read", MaxFollowUpDepth-1)}, documentView{})
	require.NoError(t, err)
	require.NoError(t, res[0].err)
	require.Len(t, res[0].Effects.Events, 1)

	res, err = e.call(context.Background(), l, route, []abi.Envelope{op("read", MaxFollowUpDepth)}, documentView{})
	require.NoError(t, err)
	require.ErrorIs(t, res[0].err, ErrFollowUpDepth)
	require.Contains(t, res[0].err.Error(), "causation chain begun by origin")
	require.Contains(t, res[0].err.Error(), "max_cascade_depth 16")
	require.Equal(t, abi.ErrorPermanent, res[0].Error.Kind)

	res, err = e.call(context.Background(), l, route, []abi.Envelope{op("ok", MaxFollowUpDepth+5)}, documentView{})
	require.NoError(t, err)
	require.NoError(t, res[0].err, "no follow-ups, no budget")
}
