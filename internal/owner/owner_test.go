package owner_test

import (
	"fmt"
	"os"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/owner"
)

// Two starts in one process (as two containers with pid 1 and one
// hostname) get two names, each still readable as hostname:pid.
func TestNewIsUniquePerStart(t *testing.T) {
	t.Parallel()
	host, err := os.Hostname()
	require.NoError(t, err)
	seen := map[string]bool{}
	for range 100 {
		n := owner.New()
		require.Regexp(t, "^"+regexp.QuoteMeta(fmt.Sprintf("%s:%d:", host, os.Getpid()))+"[0-9a-f]{12}$", n)
		require.LessOrEqual(t, len(n), 128, "fits the outbox's locked_by")
		require.False(t, seen[n], "%s handed out twice", n)
		seen[n] = true
	}
}
