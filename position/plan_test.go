package position

import (
	"testing"

	"github.com/proteanhq/protean-host/internal/testserver"
)

// TestAdvanceAllPlanProbesTheKey pins advanceAllSQL's plan as record's
// TestUpdateAllPlanProbesTheKey pins updateAllSQL's: a nested loop into
// consumer_positions' primary key whatever the table's size was when the
// connection made its generic plan.
func TestAdvanceAllPlanProbesTheKey(t *testing.T) {
	t.Parallel()
	plans := testserver.GenericPlans(t, testserver.PostgresPool(t),
		`PREPARE p(text[], text[], bigint[], text[], timestamptz, text[]) AS `+advanceAllSQL,
		`EXECUTE p('{g,g,g}', '{u1,u2,u3}', '{1,1,1}', '{"{\"s\": 2}","{\"s\": 2}","{\"s\": 2}"}', now(), '{"{\"s\": 2}","{\"s\": 2}","{\"s\": 2}"}')`,
		"consumer_positions", `INSERT INTO consumer_positions (consumer_group, unit, generation, positions, updated_at)
			SELECT 'g', 'u' || g, 1, '{"s": 1}', now() FROM generate_series(1, 20000) g`)
	for when, plan := range plans {
		if !testserver.ProbesKey(plan, "Index Scan using consumer_positions_pkey on consumer_positions c", "consumer_positions") {
			t.Errorf("%s: the plan is not a probe of the key per unit:\n%s", when, plan)
		}
	}
}
