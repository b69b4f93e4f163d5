package redispartition_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/testlog"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// logLines are the JSON log records written to buf.
func logLines(t *testing.T, buf *testlog.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(buf.String()))
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), sc.Text())
		out = append(out, m)
	}
	return out
}

// TestStartLogsOneLinePerGroup: a host that starts the workers of many
// partitions says so in one INFO line per group ("partitions running"
// with the count), and each partition's own lines (acquired, stale
// consumers deleted) are DEBUG: at 100,000 keys an INFO line per partition
// was 200,000 lines. Fails without the summary line, or with any line
// naming a partition at INFO.
func TestStartLogsOneLinePerGroup(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	h := newEffects(r.store)
	const keys = 20
	for k := range keys {
		r.pub.publish("order", "c-"+strconv.Itoa(k), 1)
	}
	for run, owner := range []string{"host-a", "host-b"} {
		var buf testlog.Buffer
		log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c := r.consumer(owner, h, 2*time.Second, func(o *redispartition.ConsumerOptions) { o.Logger = log })
		start(t, c)
		testwait.For(t, "the summary line of the group", func() (bool, string) {
			return strings.Contains(buf.String(), `"msg":"partitions running"`), fmt.Sprintf("%s owns %d", owner, len(c.Owned()))
		})
		if run == 0 {
			r.waitApplied(h)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		require.NoError(t, c.Stop(ctx))
		cancel()

		var summaries, acquired int
		for _, m := range logLines(t, &buf) {
			if m["level"] == "INFO" {
				require.NotContains(t, m, "partition", "an INFO line per partition: %v", m)
			}
			switch m["msg"] {
			case "partitions running":
				summaries++
				require.Equal(t, "INFO", m["level"])
				require.Equal(t, "proj", m["group"])
				require.EqualValues(t, keys, m["units"], "%v", m)
				require.EqualValues(t, keys, m["started"], "%v", m)
			case "partition acquired":
				acquired++
				require.Equal(t, "DEBUG", m["level"])
			}
		}
		require.Equal(t, 1, summaries, "one summary line for the group's %d partitions (%s)", keys, owner)
		require.Equal(t, keys, acquired, "each partition still logged at DEBUG (%s)", owner)
	}
}
