package httpapi

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/engine"
)

// The answer a command's unit of work stores with its idempotency key, in
// case the process dies before the API saves the full one, is the
// command's answer without follow-ups: the one shape a replay may return.
func TestCommittedAnswerIsTheCommandsAnswer(t *testing.T) {
	t.Parallel()
	evs := []eventstore.Event{{ID: "e-1", Type: "OrderPlaced", Stream: "order-o-1", Position: 0, GlobalPosition: 7}}
	got, err := committedAnswer("cmd-1", evs)
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	writeJSON(rec, http.StatusOK, &engine.CommandResult{ID: "cmd-1", Events: engine.Appended(evs)})
	require.Equal(t, rec.Code, got.Status)
	require.JSONEq(t, rec.Body.String(), string(got.Body))
	require.JSONEq(t, `{"id":"cmd-1","events":[{"id":"e-1","type":"OrderPlaced","stream":"order-o-1","position":0,"global_position":7}]}`, string(got.Body))
}
