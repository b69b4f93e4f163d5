package main

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/proteanhq/protean-host/internal/pglisten"
)

// notifications is the host's one connection LISTENing on PostgreSQL's
// notifications (pglisten.Listener), for every part that hears them: the
// partition advances of other hosts (progressListener) and the relay's
// wake-ups while it holds its broker's lease (outbox.Postgres.ListenOver).
// PostgreSQL wakes every listening session of the database at each
// notification, whatever its channel: a connection per part was a session
// woken per part, for every commit burst of every host.
type notifications struct {
	l   *pglisten.Listener
	log *slog.Logger
	run background
}

// newNotifications is a listener on config's database for channels.
func newNotifications(config *pgx.ConnConfig, log *slog.Logger, channels ...string) *notifications {
	return &notifications{l: pglisten.NewListener(config, log, channels...), log: log}
}

// start listens until stop.
func (n *notifications) start(context.Context) error {
	n.run.start(n.log, "notifications: listener", n.l.Run)
	return nil
}

// stop ends the listener and waits for it, within ctx.
func (n *notifications) stop(ctx context.Context) error { return n.run.stop(ctx) }
