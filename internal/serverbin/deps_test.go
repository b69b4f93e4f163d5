package serverbin_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestShippedBinariesLinkNoTesting: the binaries that ship (the host and
// the chaos and load harnesses) do not link package testing, goleak or
// the test servers: the harnesses find their server binaries through this
// package, which has no test code. A new import that drags testing in
// fails here, naming the binary.
func TestShippedBinariesLinkNoTesting(t *testing.T) {
	t.Parallel()
	const module = "github.com/proteanhq/protean-host/"
	for _, cmd := range []string{"cmd/protean-host", "cmd/chaos", "cmd/loadgen"} {
		out, err := exec.Command("go", "list", "-deps", module+cmd).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", cmd, err, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if dep == "testing" || strings.HasPrefix(dep, "go.uber.org/goleak") || strings.HasPrefix(dep, "github.com/stretchr/testify") ||
				strings.HasSuffix(dep, "/internal/testserver") {
				t.Errorf("%s links %s", cmd, dep)
			}
		}
	}
}
