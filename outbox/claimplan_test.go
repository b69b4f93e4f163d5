package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testserver"
)

// TestClaimPlanWalksIndexes pins that a claim costs the rows it hands out,
// not the backlog: on a 5,000-row backlog the claim's plan reads the outbox
// through indexes only, each scan bounded by its index condition, and it
// reads the primary key only to find its candidates by id, never as a
// range. The UPDATE once joined its candidates with a hash anti-join over
// every active row and found them by a sequential scan, which made the
// relay's rate fall as the backlog grew; later, on a backlog of a few
// partition keys, the probe for earlier rows of a key took the primary key
// (id < …), which walks every earlier row of the outbox, and a claim grew
// from 1 ms to 100 ms as the backlog drained; and on an outbox of mostly
// published rows, the read of each row's Prev took the primary key
// backwards.
//
// The plan is the one a relay's connection claims with: it has claimed on
// the outbox of a warm-up (a fresh deployment's first orders, not analyzed
// yet), and the outbox then grew, analyzed or (as before autovacuum's
// first pass) not. The statement of the grown outbox's epoch (claimEpoch)
// is planned for it; the warm-up epoch's, kept, served the grown outbox
// with a sequential scan to find the claim's rows, or a walk of every
// published row for each row's Prev (10-12 ms a claim under make load).
func TestClaimPlanWalksIndexes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, fill string
		chained    bool
		analyzed   bool // the fill is analyzed (else it is as autovacuum has not seen it yet)
	}{
		{"streams", `INSERT INTO outbox (message_id, stream_name, category, type, data, created_at, max_retries, target_broker)
			SELECT 'm-' || g, 'order-' || g, 'order', 'OrderPlaced', '{}', now(), 3, 'default' FROM generate_series(1, 5000) g`, false, true},
		{"few keys", fewKeysFill, true, true},
		// A drain's end: each key's Prev is read among many published rows.
		{"few keys, mostly published", mostlyPublishedFill, true, true},
		{"few keys, mostly published, not analyzed", mostlyPublishedFill, true, false},
		{"streams, not analyzed", strings.Replace(fewKeysFill, "5000", "20000", 1), true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool := testserver.PostgresPool(t)
			ctx := context.Background()
			now := time.Now()
			conn, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			params, args := "text, timestamptz, text, timestamptz", fmt.Sprintf(`'default', '%s', 'test', '%s'`,
				now.Format(time.RFC3339Nano), now.Add(time.Minute).Format(time.RFC3339Nano))
			if c.chained {
				params, args = params+", bool, int", args+", false, 0"
			}
			highest := func() int64 {
				var id int64
				require.NoError(t, conn.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM outbox`).Scan(&id))
				return id
			}
			// A warm-up's orders, published, then the first claims: past
			// the plan cache's five custom plans, to its generic plan.
			_, err = conn.Exec(ctx, strings.NewReplacer("5000", "64", "'m-'", "'warm-'").Replace(fewKeysFill)+
				`; UPDATE outbox SET status = 'published', published_at = now() WHERE id <= 60`)
			require.NoError(t, err)
			warm := claimEpoch(highest())
			_, err = conn.Exec(ctx, `PREPARE warm(`+params+`) AS `+claimQuery(50, c.chained, warm))
			require.NoError(t, err)
			for range 8 {
				_, err = conn.Exec(ctx, `EXECUTE warm(`+args+`)`)
				require.NoError(t, err)
			}
			_, err = conn.Exec(ctx, c.fill)
			require.NoError(t, err)
			if c.analyzed {
				_, err = conn.Exec(ctx, `VACUUM ANALYZE outbox`)
				require.NoError(t, err)
			}
			grown := claimEpoch(highest())
			require.Greater(t, grown, warm, "the grown outbox's claim is a statement of its own")
			_, err = conn.Exec(ctx, `PREPARE claim(`+params+`) AS `+claimQuery(50, c.chained, grown))
			require.NoError(t, err)
			for range 8 {
				tx, err := conn.Begin(ctx) // the claims change nothing: each is rolled back
				require.NoError(t, err)
				_, err = tx.Exec(ctx, `EXECUTE claim(`+args+`)`)
				require.NoError(t, err)
				require.NoError(t, tx.Rollback(ctx))
			}
			var plan []byte
			require.NoError(t, conn.QueryRow(ctx, `EXPLAIN (FORMAT JSON) EXECUTE claim(`+args+`)`).Scan(&plan))
			var doc []struct{ Plan planNode }
			require.NoError(t, json.Unmarshal(plan, &doc))
			var scans []string
			doc[0].Plan.each(func(n planNode) {
				if n.Relation == "outbox" || strings.HasPrefix(n.Index, "outbox") {
					scans = append(scans, n.Type+" "+n.Index+" "+n.Cond)
				}
			})
			require.NotEmpty(t, scans)
			for _, s := range scans {
				require.NotContains(t, s, "Seq Scan", "the claim scans the backlog; its scans of outbox: %v\n%s", scans, plan)
				if strings.Contains(s, "outbox_pkey") {
					require.Contains(t, s, "= ANY", "the claim walks the primary key; its scans of outbox: %v\n%s", scans, plan)
				}
				if strings.Contains(s, "Index") {
					require.Contains(t, s, "(", "an index walked whole; the claim's scans of outbox: %v\n%s", scans, plan)
				}
			}
		})
	}
}

// The claim's plan epoch grows by one each time the outbox's ids grow
// four times over.
func TestClaimEpoch(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		highest int64
		epoch   int
	}{{0, 0}, {1, 0}, {3, 1}, {4, 1}, {15, 2}, {16, 2}, {63, 3}, {64, 3}, {1 << 20, 10}, {1<<20 - 1, 10}, {1 << 40, 20}} {
		require.Equal(t, c.epoch, claimEpoch(c.highest), "highest %d", c.highest)
	}
	require.NotEqual(t, claimQuery(50, true, 3), claimQuery(50, true, 4))
}

// mostlyPublishedFill is fewKeysFill at 12,000 rows, all but the last
// 1,300 published: a drain's end.
var mostlyPublishedFill = strings.Replace(fewKeysFill, "5000", "12000", 1) +
	`; UPDATE outbox SET status = 'published', published_at = now() WHERE id <= 10700`

type planNode struct {
	Type     string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Alias    string     `json:"Alias"`
	Cond     string     `json:"Index Cond"`
	Loops    int        `json:"Actual Loops"`
	Plans    []planNode `json:"Plans"`
}

// each calls fn on n and on every node under it.
func (n planNode) each(fn func(planNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.each(fn)
	}
}

// fewKeysFill adds 5,000 rows on six hot partition keys, as a broker
// outage leaves them.
const fewKeysFill = `INSERT INTO outbox (message_id, stream_name, category, type, data, metadata, created_at, max_retries, target_broker, partition_key)
	SELECT 'm-' || g, 'order-' || g, 'order', 'OrderPlaced', '{}', jsonb_build_object('global_position', g), now(), 3, 'default', 'c-' || g % 6
	FROM generate_series(1, 5000) g`

// TestHeldClaimSkipsTheWalk pins the claim's gate (headsSQL): while
// another relay holds the first row of every key, a claim finds nothing
// without walking the backlog behind them: its walk of outbox_active is
// never run, in the plan for its values and in the generic plan. Without
// the gate the walk visited all 5,000 rows, each with its probe.
func TestHeldClaimSkipsTheWalk(t *testing.T) {
	t.Parallel()
	pool := testserver.PostgresPool(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, fewKeysFill)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE outbox`)
	require.NoError(t, err)
	held, err := NewPostgres(pool, nil).ClaimChained(ctx, "default", "relay-a", 50, time.Hour, Lanes{})
	require.NoError(t, err)
	require.Len(t, held, 50)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	now := time.Now()
	_, err = conn.Exec(ctx, `PREPARE claim(text, timestamptz, text, timestamptz, bool, int) AS `+claimQuery(50, true, 0))
	require.NoError(t, err)
	args := fmt.Sprintf(`'default', '%s', 'relay-b', '%s', false, 0`, now.Format(time.RFC3339Nano), now.Add(time.Minute).Format(time.RFC3339Nano))
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		_, err = conn.Exec(ctx, `SET plan_cache_mode = `+mode)
		require.NoError(t, err)
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		var plan []byte
		require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim(`+args+`)`).Scan(&plan))
		require.NoError(t, tx.Rollback(ctx))
		var doc []struct{ Plan planNode }
		require.NoError(t, json.Unmarshal(plan, &doc))
		walks := 0
		doc[0].Plan.each(func(n planNode) {
			if n.Relation == "outbox" && n.Alias == "c" {
				walks++
				require.Zero(t, n.Loops, "%s: the claim walked the backlog behind the held keys\n%s", mode, plan)
			}
		})
		require.Equal(t, 1, walks, "%s: the plan has one walk (alias c)\n%s", mode, plan)
	}
}
