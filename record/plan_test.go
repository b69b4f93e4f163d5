package record

import (
	"testing"

	"github.com/proteanhq/protean-host/internal/testserver"
)

// TestUpdateAllPlanProbesTheKey pins updateAllSQL's plan: the generic plan
// a connection makes while records is empty, and keeps, is a nested loop
// from the arrays into records_pkey, never a scan of the table, also once
// the table has grown (unanalyzed, as before autovacuum gets to it) and
// after ANALYZE.
func TestUpdateAllPlanProbesTheKey(t *testing.T) {
	t.Parallel()
	plans := testserver.GenericPlans(t, testserver.PostgresPool(t),
		`PREPARE p(text[], text[], text[], text[], bigint[], bigint[]) AS `+updateAllDML,
		`EXECUTE p('{projection,projection,projection}', '{t,t,t}', '{k1,k2,k3}', '{"{}","{}","{}"}', '{1,1,1}', '{1,1,1}')`,
		"records", `INSERT INTO records (kind, type, id, version, data) SELECT 'projection', 't', 'k' || g, 1, '{}' FROM generate_series(1, 20000) g`)
	for when, plan := range plans {
		if !testserver.ProbesKey(plan, "Index Scan using records_pkey on records r", "records") {
			t.Errorf("%s: the plan is not a probe of the key per write:\n%s", when, plan)
		}
	}
}
