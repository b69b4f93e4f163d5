package unitofwork

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/eventstore"
)

func TestOutboxMetadataRefusesWhatDoesNotDecode(t *testing.T) {
	_, err := outboxMetadata(eventstore.Event{ID: "e-1", Stream: "order-1", Metadata: json.RawMessage(`{"correlation_id":`)})
	require.ErrorContains(t, err, "event e-1 of stream order-1: metadata")
	b, err := outboxMetadata(eventstore.Event{ID: "e-2", Stream: "order-1", Position: 3, GlobalPosition: 9,
		Metadata: json.RawMessage(`{"correlation_id":"c"}`)})
	require.NoError(t, err)
	require.JSONEq(t, `{"correlation_id":"c","position":3,"global_position":9,"time":"0001-01-01T00:00:00Z"}`, string(b))
}
