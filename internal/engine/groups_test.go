package engine

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/groups"
	"github.com/proteanhq/protean-host/internal/routes"
)

// startGroups starts broker groups on src that deliver to e, wired as the
// host wires them (o gives the rest); the test's cleanup stops them, then
// e.
func startGroups(t testing.TB, e *Engine, src groups.Source, o groups.Options) *groups.Consumer {
	t.Helper()
	o.Source, o.Handler, o.Classify, o.Handles = src, e.Handler(), Classify, e.Handles
	o.Groups = func() []groups.Group { return routes.Of(e.Set(), e.opts.Partitioned).Groups() }
	if o.Logger == nil {
		o.Logger = e.log
	}
	g := groups.New(o)
	require.NoError(t, g.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, stopAll(context.Background(), g, e)) })
	return g
}

// stopAll stops as the host does: the groups, then the engine.
func stopAll(ctx context.Context, g *groups.Consumer, e *Engine) error {
	return errors.Join(g.Stop(ctx), e.Stop(ctx))
}
