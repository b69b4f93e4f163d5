package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testserver"
)

// TestClaimPlanWalksIndexes pins that a claim costs the rows it hands out,
// not the backlog: on a 5,000-row backlog the claim's plan reads the outbox
// through indexes only, in the plan for its values and in the generic plan
// (the one a prepared claim ends up with). The UPDATE once joined its candidates with a hash
// anti-join over every active row and found them by a sequential scan,
// which made the relay's rate fall as the backlog grew.
func TestClaimPlanWalksIndexes(t *testing.T) {
	t.Parallel()
	pool := testserver.PostgresPool(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO outbox (message_id, stream_name, category, type, data, created_at, max_retries, target_broker)
		SELECT 'm-' || g, 'order-' || g, 'order', 'OrderPlaced', '{}', now(), 3, 'default' FROM generate_series(1, 5000) g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE outbox`)
	require.NoError(t, err)
	now := time.Now()
	// The plan for these values, and the generic plan the server's plan
	// cache settles on for a prepared claim (claimQuery).
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `PREPARE claim(text, timestamptz, text, timestamptz) AS `+claimQuery(50, false))
	require.NoError(t, err)
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		_, err = conn.Exec(ctx, `SET plan_cache_mode = `+mode)
		require.NoError(t, err)
		var plan []byte
		require.NoError(t, conn.QueryRow(ctx, fmt.Sprintf(`EXPLAIN (FORMAT JSON) EXECUTE claim('default', '%s', 'test', '%s')`,
			now.Format(time.RFC3339Nano), now.Add(time.Minute).Format(time.RFC3339Nano))).Scan(&plan))
		var doc []struct{ Plan planNode }
		require.NoError(t, json.Unmarshal(plan, &doc))
		var scans []string
		var walk func(n planNode)
		walk = func(n planNode) {
			if n.Relation == "outbox" {
				scans = append(scans, n.Type+" "+n.Index)
			}
			for _, c := range n.Plans {
				walk(c)
			}
		}
		walk(doc[0].Plan)
		require.NotEmpty(t, scans)
		for _, s := range scans {
			require.NotContains(t, s, "Seq Scan", "%s: the claim scans the backlog; its scans of outbox: %v\n%s", mode, scans, plan)
		}
	}
	_, err = conn.Exec(ctx, `DEALLOCATE claim; RESET plan_cache_mode`)
	require.NoError(t, err)
}

type planNode struct {
	Type     string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Plans    []planNode `json:"Plans"`
}
