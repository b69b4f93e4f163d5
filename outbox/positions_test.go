package outbox

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
)

func TestFillPositionsReportsUnreadableMetadata(t *testing.T) {
	m := broker.Message{ID: "m-1", Metadata: json.RawMessage(`{"position":`)}
	require.ErrorContains(t, fillPositions(&m), "message m-1: metadata")
	m = broker.Message{ID: "m-2", Metadata: json.RawMessage(`{"position":2,"global_position":7}`)}
	require.NoError(t, fillPositions(&m))
	require.Equal(t, int64(2), m.Position)
	require.Equal(t, int64(7), m.GlobalPosition)
	m = broker.Message{ID: "m-3"}
	require.NoError(t, fillPositions(&m))
}
