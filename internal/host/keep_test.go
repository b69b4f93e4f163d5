package host_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/testlog"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// A Go guest on ABI v2 keeps its instance: memory_limit answers the
// smaller of memory_mb and recycle_above_mb, so the guest's collector
// runs before its heap crosses the recycle mark, and a long run of
// batches is served by one warm instance instead of a fresh one (a new
// instance, its runtime's start, its heap grown and copied again) every
// few dozen calls.
func TestGoGuestKeepsItsInstance(t *testing.T) {
	var logs testlog.Buffer
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{}), CacheDir: wasmbuild.CacheDir(t), Instances: 1,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	m, err := l.LoadFile(context.Background(), wasmbuild.Copy(t, wasmbuild.Build(t, "./plugins/examples/client_orders"), t.TempDir(), "client_orders.wasm"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	s := &docSession{doc: startDoc}
	batch := events(50)
	// Each batch leaves ~0.4 MiB of garbage: 300 batches is ~120 MiB,
	// several times recycle_above_mb (32).
	for i := range 300 {
		res, err := m.Handle(context.Background(), "client_orders", batch, s)
		require.NoError(t, err, "batch %d", i)
		require.Len(t, res, len(batch))
		require.Nil(t, res[0].Error)
	}
	require.NotContains(t, logs.Take(), "instance recycled", "the guest's heap crossed recycle_above_mb")
}
