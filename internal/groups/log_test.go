package groups_test

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/groups"
	"github.com/proteanhq/protean-host/internal/testlog"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// TestLogCountsTheGroupsItRuns: the consumer's line counts the broker
// consumer groups it runs and is named for them, and a consumer that runs
// none (every handler partitioned: partition workers run them and log
// their own count) logs no "running=0". Fails on the old "delivery
// consumers running=0 started=0".
func TestLogCountsTheGroupsItRuns(t *testing.T) {
	b := newInline(t)
	rec := &recorder{handled: map[string][]string{}}
	var mu sync.Mutex
	var want []groups.Group
	var buf testlog.Buffer
	asked := make(chan struct{}, 1)
	c := groups.New(groups.Options{Source: b, Handler: rec, Classify: classify, Groups: func() []groups.Group {
		mu.Lock()
		defer mu.Unlock()
		select {
		case asked <- struct{}{}:
		default:
		}
		return slices.Clone(want)
	}, Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, c.Stop(context.Background())) })
	// The first pass reads no groups; the passes run one after another,
	// so once the next pass's line is in, the first's would be too.
	testwait.Recv(t, "the first pass", asked)

	lines := func() []map[string]any {
		var out []map[string]any
		sc := bufio.NewScanner(strings.NewReader(buf.String()))
		for sc.Scan() {
			var m map[string]any
			require.NoError(t, json.Unmarshal(sc.Bytes(), &m), sc.Text())
			if strings.Contains(m["msg"].(string), "consumer") {
				out = append(out, m)
			}
		}
		return out
	}
	// resubscribe sets the groups and waits for the consumer's line on them.
	resubscribe := func(gs []groups.Group, n int) map[string]any {
		t.Helper()
		mu.Lock()
		want = gs
		mu.Unlock()
		c.Resubscribe()
		testwait.For(t, "the consumer's line", func() (bool, string) {
			return len(lines()) >= n, buf.String()
		})
		got := lines()
		require.Len(t, got, n, buf.String())
		return got[n-1]
	}

	// No line for the first pass on no groups, then one on two started.
	a, s := groups.Group{Handler: "a", Stream: "s"}, groups.Group{Handler: "b", Stream: "t"}
	line := resubscribe([]groups.Group{a, s}, 1)
	require.Equal(t, "broker consumer groups running", line["msg"])
	require.EqualValues(t, 2, line["groups"])
	require.EqualValues(t, 2, line["started"])
	require.EqualValues(t, 0, line["stopped"])

	line = resubscribe([]groups.Group{a}, 2)
	require.EqualValues(t, 1, line["groups"])
	require.EqualValues(t, 0, line["started"])
	require.EqualValues(t, 1, line["stopped"])

	// A pass that changes nothing says nothing: the next line is the
	// next change's.
	c.Resubscribe()
	line = resubscribe([]groups.Group{a, s}, 3)
	require.EqualValues(t, 2, line["groups"])
	require.EqualValues(t, 1, line["started"])
}
