package readyourwrites

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/eventstore"
)

// A consumer's marks fold into the watermark as they pile up; a gap (an
// event never handled) stops the fold there, and then the walks thin out
// (not one per event) until the gap is handled.
func TestMarksCompact(t *testing.T) {
	events := eventstore.NewMemory(nil)
	ctx := context.Background()
	var evs []eventstore.NewEvent
	for i := range 3 * compactAt {
		evs = append(evs, eventstore.NewEvent{Stream: fmt.Sprintf("c-%d", i), Type: "E", Data: json.RawMessage(`{}`), ExpectedVersion: eventstore.AnyVersion})
	}
	stored, err := events.Append(ctx, evs)
	require.NoError(t, err)
	w := New(Options{Events: events})
	r := Route{Group: "g", Category: "c"}
	mark := func(gp int64) {
		if w.Mark(r, gp) {
			w.Fold(ctx, r, gp, nil)
		}
	}
	for _, ev := range stored[:compactAt] {
		mark(ev.GlobalPosition)
	}
	require.Equal(t, stored[compactAt-1].GlobalPosition, w.marks.watermark("g", "c"), "folded")
	require.Empty(t, w.marks.groups["g"]["c"].above)

	gap := stored[compactAt+10].GlobalPosition
	for _, ev := range stored[compactAt:] {
		if ev.GlobalPosition != gap {
			mark(ev.GlobalPosition)
		}
	}
	require.Equal(t, gap-1, w.marks.watermark("g", "c"), "folded up to the gap")
	h := w.marks.groups["g"]["c"]
	require.Len(t, h.above, int(stored[len(stored)-1].GlobalPosition-gap), "the marks above the gap are kept")
	require.Greater(t, h.walkAt, len(h.above), "the next walk waits for more than are kept")

	mark(gap)
	ok, err := w.caughtUp(ctx, Target{Route: r}, stored[len(stored)-1].GlobalPosition, &pass{})
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, stored[len(stored)-1].GlobalPosition, w.marks.watermark("g", "c"))
	require.Empty(t, h.above)
}
