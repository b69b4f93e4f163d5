package pglisten

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/proteanhq/protean-host/internal/backoff"
)

// Listen LISTENs on channel over one connection of its own (config: a
// pool's) and calls fn with each notification's payload, in the order
// PostgreSQL delivers them, until ctx ends. When the connection is lost,
// or fn returns an error, it logs and connects again after a backoff
// (100 ms doubling to 5 s). listening, if set, is told when it starts
// hearing (LISTEN done) and when it stops (the connection lost, or ctx
// ended). It returns ctx's error.
func Listen(ctx context.Context, config *pgx.ConnConfig, channel string, log *slog.Logger, fn func(payload string) error, listening func(bool)) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if listening == nil {
		listening = func(bool) {}
	}
	for failures := 0; ; failures++ {
		err := listenOnce(ctx, config, channel, fn, listening)
		listening(false)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		delay := backoff.Delay(failures, 100*time.Millisecond, 2, 5*time.Second, 0.2, rand.Float64)
		log.Warn("listening for notifications failed; connecting again", "channel", channel, "error", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

func listenOnce(ctx context.Context, config *pgx.ConnConfig, channel string, fn func(string) error, listening func(bool)) error {
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, `LISTEN `+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	listening(true)
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if err := fn(n.Payload); err != nil {
			return err
		}
	}
}
