package engine

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/groups"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/routes"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// A delivery whose guest loops without ever calling the host (the case
// only the module's instrumentation can stop, see host/doc.go) is
// stopped by Stop's hard phase: Stop returns at its deadline without
// abandoning anything, and the engine ends.
func TestStopEndsAPureGuestLoopAtItsDeadline(t *testing.T) {
	// The module's own deadline is far off: only Stop can end the call.
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{Timeout: time.Hour}), Instances: 2, CacheDir: wasmbuild.CacheDir(t)})
	require.NoError(t, err)
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"))
	require.NoError(t, err)
	require.Equal(t, host.DeadlineInstrumented, m.Deadline)
	set, problems := host.NewSet([]*host.Module{m}, host.Broker{Name: "default", Provider: "inline"})
	require.Empty(t, problems)
	mem := unitofwork.NewMemory()
	recs := &untilRecords{Store: mem.Records, spinning: make(chan string, 2), released: make(chan struct{})}
	e := New(set, Options{Events: mem.Events, Records: recs, UnitOfWork: unitofwork.New(mem, unitofwork.Options{Broker: "default"})})
	src, err := broker.NewInline(broker.DefaultOptions())
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	t.Cleanup(func() { _ = src.Close() })
	t.Cleanup(func() { ended(t, e) })

	g := groups.New(groups.Options{Source: src, Handler: e.Handler(), Classify: Classify,
		Groups: func() []groups.Group { return routes.Of(e.Set(), false).Groups() }})
	require.NoError(t, g.Start(context.Background()))
	require.NoError(t, src.Publish(context.Background(), delivery.Message{ID: "op-1", Stream: "ops", Type: "Op",
		EventStream: "ops-d", Data: json.RawMessage(`{"op":"load_loop","id":"d","arg":"go"}`)}))
	require.Equal(t, "ops", testwait.Recv(t, "the guest to reach its loop", recs.spinning))

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err = stopAll(ctx, g, e)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, ErrAbandoned, "the looping guest was not stopped within the grace")
	ended(t, e)
}
