package partition_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestPostgreSQLPathsImportNoRedis pins the split between the pure
// partition rules and the Redis runtime: the packages a PostgreSQL-only
// deployment runs (the outbox, the unit of work, the event store, the
// engine...) must not link go-redis or package redispartition. A new import
// that drags Redis in fails here with the path it came by.
func TestPostgreSQLPathsImportNoRedis(t *testing.T) {
	t.Parallel()
	const module = "github.com/proteanhq/protean-host/"
	pkgs := []string{"partition", "outbox", "internal/unitofwork", "internal/subscription", "eventstore", "position",
		"record", "internal/idempotency", "internal/engine", "internal/host", "internal/httpapi", "delivery", "broker"}
	for _, p := range pkgs {
		out, err := exec.Command("go", "list", "-deps", module+p).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", p, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if strings.HasPrefix(dep, "github.com/redis/go-redis") || strings.HasSuffix(dep, "/redispartition") {
				t.Errorf("package %s depends on %s", p, dep)
				break
			}
		}
	}
}
