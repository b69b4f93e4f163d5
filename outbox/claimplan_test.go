package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testserver"
)

// TestClaimPlanWalksIndexes pins that a claim costs the rows it hands out,
// not the backlog: on a 5,000-row backlog the claim's plan reads the outbox
// through indexes only, in the plan for its values and in the generic plan
// (the one a prepared claim ends up with), and it reads the primary key only
// to find its candidates by id, never as a range. The UPDATE once joined its
// candidates with a hash anti-join over every active row and found them by
// a sequential scan, which made the relay's rate fall as the backlog grew;
// later, on a backlog of a few partition keys, the probe for earlier rows of
// a key took the primary key (id < …), which walks every earlier row of the
// outbox, and a claim grew from 1 ms to 100 ms as the backlog drained; and
// on an outbox of mostly published rows, the read of each row's Prev took
// the primary key backwards.
func TestClaimPlanWalksIndexes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, fill string
		chained    bool
	}{
		{"streams", `INSERT INTO outbox (message_id, stream_name, category, type, data, created_at, max_retries, target_broker)
			SELECT 'm-' || g, 'order-' || g, 'order', 'OrderPlaced', '{}', now(), 3, 'default' FROM generate_series(1, 5000) g`, false},
		{"few keys", fewKeysFill, true},
		// A drain's end: each key's Prev is read among many published rows.
		{"few keys, mostly published", strings.Replace(fewKeysFill, "5000", "12000", 1) +
			`; UPDATE outbox SET status = 'published', published_at = now() WHERE id <= 10700`, true},
		// A fresh deployment: the relay's first claims find the outbox
		// empty and never analyzed, and the generic plan they leave serves
		// the connection from then on, however large the outbox grows.
		{"empty, never analyzed", "", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool := testserver.PostgresPool(t)
			ctx := context.Background()
			if c.fill != "" {
				_, err := pool.Exec(ctx, c.fill)
				require.NoError(t, err)
				_, err = pool.Exec(ctx, `VACUUM ANALYZE outbox`)
				require.NoError(t, err)
			}
			now := time.Now()
			conn, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			params, args := "text, timestamptz, text, timestamptz", fmt.Sprintf(`'default', '%s', 'test', '%s'`,
				now.Format(time.RFC3339Nano), now.Add(time.Minute).Format(time.RFC3339Nano))
			if c.chained {
				params, args = params+", bool, int", args+", false, 0"
			}
			_, err = conn.Exec(ctx, `PREPARE claim(`+params+`) AS `+claimQuery(50, c.chained))
			require.NoError(t, err)
			// The plan for these values, and the generic plan the server's
			// plan cache settles on for a prepared claim (claimQuery).
			for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
				_, err = conn.Exec(ctx, `SET plan_cache_mode = `+mode)
				require.NoError(t, err)
				plan := explainUnder(t, conn, claimSetting, `EXECUTE claim(`+args+`)`)
				var doc []struct{ Plan planNode }
				require.NoError(t, json.Unmarshal(plan, &doc))
				var scans []string
				doc[0].Plan.each(func(n planNode) {
					if n.Relation == "outbox" {
						scans = append(scans, n.Type+" "+n.Index+" "+n.Cond)
					}
				})
				require.NotEmpty(t, scans)
				for _, s := range scans {
					require.NotContains(t, s, "Seq Scan", "%s: the claim scans the backlog; its scans of outbox: %v\n%s", mode, scans, plan)
					if strings.Contains(s, "outbox_pkey") {
						require.Contains(t, s, "= ANY", "%s: the claim walks the primary key; its scans of outbox: %v\n%s", mode, scans, plan)
					}
				}
			}
			_, err = conn.Exec(ctx, `DEALLOCATE claim; RESET plan_cache_mode`)
			require.NoError(t, err)
		})
	}
}

// explainUnder is the plan of stmt in a transaction under setting (a SET
// LOCAL), as the relay runs its statements (queryUnder).
func explainUnder(t *testing.T, conn *pgxpool.Conn, setting, stmt string) []byte {
	t.Helper()
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { require.NoError(t, tx.Rollback(ctx)) }()
	_, err = tx.Exec(ctx, setting)
	require.NoError(t, err)
	var plan []byte
	require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+stmt).Scan(&plan))
	return plan
}

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
	_, err = conn.Exec(ctx, `PREPARE claim(text, timestamptz, text, timestamptz, bool, int) AS `+claimQuery(50, true))
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
