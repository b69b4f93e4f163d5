package main

import (
	"context"
	"errors"
	"log/slog"
)

// background runs one goroutine of a host part from its start to its
// stop: the notifications listener, the progress listener.
type background struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// start runs fn until stop; an error of fn other than its cancellation is
// logged as what.
func (b *background) start(log *slog.Logger, what string, fn func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel, b.done = cancel, make(chan struct{})
	go func() {
		defer close(b.done)
		if err := fn(ctx); err != nil && !errors.Is(err, context.Canceled) {
			log.Warn(what+" stopped", "error", err)
		}
	}()
}

// stop ends fn and waits for it, within ctx; a part never started stops
// at once.
func (b *background) stop(ctx context.Context) error {
	if b.cancel == nil {
		return nil
	}
	b.cancel()
	select {
	case <-b.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
