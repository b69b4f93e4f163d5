package outbox

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testserver"
)

// The database writes an event's time into an outbox row's metadata
// exactly as encoding/json writes the time.Time the event store returns
// for it, whatever its fraction.
func TestTimeJSONIsGoEncoding(t *testing.T) {
	t.Parallel()
	pool := testserver.PostgresPool(t)
	for _, ts := range []time.Time{
		time.Date(2026, 12, 1, 6, 2, 45, 0, time.UTC),
		time.Date(2026, 12, 1, 6, 2, 40, 500000000, time.UTC),
		time.Date(2026, 12, 1, 6, 2, 45, 120000000, time.UTC),
		time.Date(2026, 12, 1, 6, 2, 45, 123456000, time.UTC),
		time.Date(2026, 12, 1, 6, 2, 45, 1000, time.UTC),
		time.Date(2026, 1, 9, 0, 0, 0, 10000, time.UTC),
		time.Date(999, 1, 1, 23, 59, 59, 999999000, time.UTC),
	} {
		var got string
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT `+timeJSON("$1::timestamp"), ts).Scan(&got))
		want, err := json.Marshal(ts)
		require.NoError(t, err)
		require.Equal(t, string(want), `"`+got+`"`)
		var back time.Time
		require.NoError(t, json.Unmarshal([]byte(`"`+got+`"`), &back))
		require.True(t, ts.Equal(back))
	}
}
