package engine_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestEngineLinksNoDeliverySource pins the engine's place: it handles what
// the delivery sources hand it and waits for read-your-writes, and knows
// no delivery source, Redis or route table. A new import that drags one in fails
// here with the package it came by.
func TestEngineLinksNoDeliverySource(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/proteanhq/protean-host/internal/engine").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	const module = "github.com/proteanhq/protean-host/"
	// (The unit of work links package outbox, whose rows it writes, and
	// host links package broker, whose capabilities it validates against:
	// neither is a source.)
	banned := []string{module + "internal/groups", module + "internal/redisstream", module + "internal/redispartition",
		module + "internal/routes", "github.com/redis/go-redis/v9"}
	for _, dep := range strings.Fields(string(out)) {
		for _, b := range banned {
			if dep == b {
				t.Errorf("package engine depends on %s", dep)
			}
		}
	}
}
