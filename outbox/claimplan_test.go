package outbox

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testserver"
)

// TestClaimPlanWalksIndexes pins that a claim costs the rows it hands out,
// not the backlog: on a 5,000-row backlog the claim's plan reads the outbox
// through indexes only. The UPDATE once joined its candidates with a hash
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
	var plan []byte
	require.NoError(t, pool.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+claimSQL, "default", now, 50, "test", now.Add(time.Minute)).Scan(&plan))
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
		require.NotContains(t, s, "Seq Scan", "the claim scans the backlog; its scans of outbox: %v\n%s", scans, plan)
	}
}

type planNode struct {
	Type     string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Plans    []planNode `json:"Plans"`
}
