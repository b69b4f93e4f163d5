package config_test

import (
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/relay"
	"github.com/proteanhq/protean-host/outbox"
)

// Default is built from the packages' defaults; converting back to
// durations through the config's own accessors gives the packages' values
// (no unit lost on the way), so a package used without config behaves as
// the host does with an empty file.
func TestDefaultAgreesWithPackages(t *testing.T) {
	t.Parallel()
	cfg := config.Default()
	d := relay.DefaultOptions()
	o := cfg.Outbox
	require.Equal(t, d.BatchSize, o.MessagesPerTick)
	require.Equal(t, d.Tick, o.TickInterval())
	require.Equal(t, outbox.DefaultMaxRetries, o.MaxRetries)
	require.Equal(t, d.BaseDelay, o.BaseRetryDelay())
	require.Equal(t, d.MaxDelay, o.MaxRetryDelay())
	require.Equal(t, d.Jitter, o.BackoffJitter)
	require.Equal(t, d.LockFor, o.LockTimeout())
	require.Equal(t, d.PublishedRetention, o.PublishedRetention())
	require.Equal(t, d.AbandonedRetention, o.AbandonedRetention())

	part := redispartition.DefaultConsumerOptions()
	p := cfg.Server.Partitioning
	require.Equal(t, part.LeaseTTL, p.LeaseTTL())
	require.Equal(t, part.Heartbeat, p.HeartbeatInterval())
	require.Equal(t, part.Poll, p.PollInterval())
	require.Equal(t, part.ReapIdle, p.ReapIdle())
	require.Equal(t, part.WarnLivePartitions, p.WarnLivePartitions)
	require.Equal(t, part.BackfillSuffix, cfg.Server.PriorityLanes.BackfillSuffix)

	sub := broker.DefaultOptions()
	s := cfg.Server.StreamSubscription
	require.Equal(t, sub.MaxRetries, s.MaxRetries)
	require.Equal(t, sub.Delay, s.RetryDelay())
	require.Equal(t, sub.MaxDelay, s.MaxRetryDelay())
	require.Equal(t, part.Retry, s.Policy(), "the consumer and the broker retry alike")

	lim := host.DefaultLimits()
	l := cfg.Plugins.Limits
	require.Equal(t, lim.MemoryMB, l.MemoryMB)
	require.Equal(t, lim.Timeout, l.Timeout())
	require.Equal(t, lim.ManifestTimeout, l.ManifestTimeout())
	require.Equal(t, int64(lim.MaxOutputBytes), l.MaxOutputBytes)
	require.Equal(t, !lim.Uninterruptible, l.Interruptible)
	require.Equal(t, lim.InstanceIdle, l.InstanceIdle())
	require.Equal(t, lim.CodeIdle, l.CodeIdle())
}

// doc.go lists every default; the list is generated from Default, so a
// changed or added default fails here until the doc says it. The message
// carries the block to paste.
func TestDocListsEveryDefault(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	const begin, end = "list in step):\n", "//\n// End of defaults."
	doc := string(src)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	require.True(t, i >= 0 && j > i, "doc.go has no defaults block")
	var lines []string
	flatten("", reflect.ValueOf(config.Default()), &lines)
	want := "//\n"
	for _, l := range lines {
		want += "//\t" + l + "\n"
	}
	got := doc[i+len(begin) : j]
	require.Equal(t, want, got, "doc.go's defaults block is stale; it should be:\n%s", want)
}

// flatten lists the TOML keys of v with their values, sorted by key.
func flatten(prefix string, v reflect.Value, out *[]string) {
	var lines []string
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if tag := f.Tag.Get("toml"); tag != "" || !f.Anonymous {
				flatten(prefix+tag+".", v.Field(i), &lines)
			} else { // embedded: its keys are the outer table's
				flatten(prefix, v.Field(i), &lines)
			}
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			flatten(prefix+k.String()+".", v.MapIndex(k), &lines)
		}
	case reflect.Pointer:
		if v.IsNil() {
			lines = append(lines, strings.TrimSuffix(prefix, ".")+" = (unset)")
		} else {
			flatten(prefix, v.Elem(), &lines)
		}
	case reflect.String:
		lines = append(lines, fmt.Sprintf("%s = %q", strings.TrimSuffix(prefix, "."), v.String()))
	default:
		lines = append(lines, fmt.Sprintf("%s = %v", strings.TrimSuffix(prefix, "."), v.Interface()))
	}
	slices.Sort(lines)
	*out = append(*out, lines...)
}
