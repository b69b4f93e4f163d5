package subscription_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/engine"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// A message whose effects the stores refuse (here a record holding
// \u0000, a lone surrogate or bytes that are not UTF-8, which PostgreSQL's
// jsonb cannot store, refused before the database by both stores; on
// PostgreSQL the last two were a database error) fails the same way
// on every attempt. With the engine's Classify it is the message's own
// failure: recorded for an operator and skipped, and the messages after it
// are handled. Classified as an infrastructure error it was retried
// without end: the category stalled for good, with no record to skip.
func TestRefusedEffectsAreRecordedNotRetriedForever(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, data, why string }{
		{"nul", `{"s":"\u0000"}`, "\\u0000"},
		{"lone surrogate", `{"s":"\ud83d"}`, "lone surrogate"},
		{"not utf-8", "{\"s\":\"\xff\"}", "UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testRefusedEffects(t, json.RawMessage(tc.data), tc.why)
		})
	}
}

func testRefusedEffects(t *testing.T, data json.RawMessage, why string) {
	onBoth(t, func(t *testing.T, h *harness) {
		pos := appendEvents(t, h.events, "order", []string{"a", "b"}, 5)
		r := newRecorder(h.uow)
		r.poison = func(m delivery.Message) bool { return m.GlobalPosition == pos[2] }
		r.poisonData = data
		h.consumer(t, r, consumerOpts{subs: []subscription.Subscription{{Group: "proj", Category: "order"}},
			retries: 2, classify: engine.Classify})
		r.waitApplied(t, "proj", concat(pos[:2], pos[3:]))
		testwait.For(t, "the refused message is recorded as failed", func() (bool, string) {
			recs, err := h.failures.List(t.Context(), "proj", "order", true)
			if err != nil {
				return false, err.Error()
			}
			ok := len(recs) == 1 && recs[0].GlobalPosition == pos[2] && recs[0].Status == subscription.StatusFailed
			return ok, fmt.Sprintf("records %+v", recs)
		})
		recs, err := h.failures.List(t.Context(), "proj", "order", true)
		require.NoError(t, err)
		require.Equal(t, 1, recs[0].Attempts, "not retried: the same effects are refused every time")
		require.Contains(t, recs[0].Error, why)
	})
}
