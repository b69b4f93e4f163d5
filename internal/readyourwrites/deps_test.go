package readyourwrites_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestTheWaitKnowsNoSource pins who owns read-your-writes: the wait reads
// the event store and asks a Source; the sources (the partition workers'
// positions, the subscriptions' failure records, the broker's groups) are
// answered next to their own storage. A new import that drags one of them
// in here fails with the path it came by.
func TestTheWaitKnowsNoSource(t *testing.T) {
	t.Parallel()
	const module = "github.com/proteanhq/protean-host/"
	out, err := exec.Command("go", "list", "-deps", module+"internal/readyourwrites").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	forbidden := []string{"position", "internal/subscription", "partition", "broker", "internal/redispartition", "internal/redisstream",
		"internal/groups", "outbox", "internal/unitofwork", "record", "internal/engine", "internal/host"}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/redis/go-redis") {
			t.Errorf("depends on %s", dep)
		}
		for _, f := range forbidden {
			if dep == module+f || strings.HasPrefix(dep, module+f+"/") {
				t.Errorf("depends on %s", dep)
			}
		}
	}
}
