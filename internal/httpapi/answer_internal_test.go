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
// command's answer without follow-ups, in the very bytes the API sends:
// a final one (no follow-ups) is then the answer, and is not saved again.
func TestCommittedAnswerIsTheCommandsAnswer(t *testing.T) {
	t.Parallel()
	evs := []eventstore.Event{{ID: "e-1", Type: "OrderPlaced", Stream: "order-o-1", Position: 0, GlobalPosition: 7}}
	rec := httptest.NewRecorder()
	writeJSON(rec, http.StatusOK, &engine.CommandResult{ID: "cmd-1", Events: engine.Appended(evs)})

	var c committedAnswer
	got, err := c.build("cmd-1", evs, false)
	require.NoError(t, err)
	require.Equal(t, rec.Code, got.Status)
	require.Equal(t, rec.Body.String(), string(got.Body), "byte for byte")
	require.JSONEq(t, `{"id":"cmd-1","events":[{"id":"e-1","type":"OrderPlaced","stream":"order-o-1","position":0,"global_position":7}]}`, string(got.Body))
	require.False(t, c.is(http.StatusOK, rec.Body.Bytes()), "not final: the full answer (with follow-ups) is saved")

	_, err = c.build("cmd-1", evs, true)
	require.NoError(t, err)
	require.True(t, c.is(http.StatusOK, rec.Body.Bytes()), "final and sent as stored: nothing to save")
	require.False(t, c.is(http.StatusUnprocessableEntity, rec.Body.Bytes()), "another status is saved")
	require.False(t, c.is(http.StatusOK, append(rec.Body.Bytes()[:len(rec.Body.Bytes())-1:len(rec.Body.Bytes())-1], ' ')), "other bytes are saved")
	require.False(t, (&committedAnswer{}).is(http.StatusOK, rec.Body.Bytes()), "no answer stored (memory store): saved")
}
