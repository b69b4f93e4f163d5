package relay

import (
	"encoding/json"
	"testing"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/stretchr/testify/require"
)

func TestFillPositionsReportsUnreadableMetadata(t *testing.T) {
	m := delivery.Message{ID: "m-1", Metadata: json.RawMessage(`{"position":`)}
	require.ErrorContains(t, fillPositions(&m), "message m-1: metadata")
	m = delivery.Message{ID: "m-2", Metadata: json.RawMessage(`{"position":2,"global_position":7}`)}
	require.NoError(t, fillPositions(&m))
	require.Equal(t, int64(2), m.Position)
	require.Equal(t, int64(7), m.GlobalPosition)
	m = delivery.Message{ID: "m-3"}
	require.NoError(t, fillPositions(&m))
}
