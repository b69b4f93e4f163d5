package pglisten

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/proteanhq/protean-host/internal/backoff"
)

// Backoff between connections: 100 ms doubling to maxDelay. A connection
// that listened for maxDelay or longer was healthy: the next failure
// starts the backoff again from 100 ms.
const (
	firstDelay = 100 * time.Millisecond
	maxDelay   = 5 * time.Second
)

// Listen LISTENs on channel over one connection of its own (config: a
// pool's) and calls fn with each notification's payload, in the order
// PostgreSQL delivers them, until ctx ends. When the connection is lost,
// or fn returns an error, it logs and connects again after a backoff
// (100 ms doubling to 5 s). listening, if set, is told when it starts
// hearing (LISTEN done) and when it stops (the connection lost, or ctx
// ended). It returns ctx's error. (Listener shares one connection among
// several channels.)
func Listen(ctx context.Context, config *pgx.ConnConfig, channel string, log *slog.Logger, fn func(payload string) error, listening func(bool)) error {
	return run(ctx, config, []string{channel}, log, func(_, payload string) error { return fn(payload) }, listening)
}

// run is the loop of Listen and Listener.Run: one connection LISTENing on
// channels, each notification handed to dispatch.
func run(ctx context.Context, config *pgx.ConnConfig, channels []string, log *slog.Logger, dispatch func(channel, payload string) error, listening func(bool)) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if listening == nil {
		listening = func(bool) {}
	}
	for failures := 0; ; failures++ {
		heard, err := listenOnce(ctx, config, channels, dispatch, listening)
		listening(false)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if heard >= maxDelay {
			failures = 0
		}
		delay := backoff.Delay(failures, firstDelay, 2, maxDelay, 0.2, rand.Float64)
		log.Warn("listening for notifications failed; connecting again", "channels", strings.Join(channels, ","), "error", err, "retry_in", delay)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// listenOnce holds one connection until it fails or ctx ends, and says
// for how long it listened.
func listenOnce(ctx context.Context, config *pgx.ConnConfig, channels []string, dispatch func(string, string) error, listening func(bool)) (time.Duration, error) {
	conn, err := pgx.ConnectConfig(ctx, config)
	if err != nil {
		return 0, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	for _, ch := range channels {
		if _, err := conn.Exec(ctx, `LISTEN `+pgx.Identifier{ch}.Sanitize()); err != nil {
			return 0, err
		}
	}
	listening(true)
	since := time.Now()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return time.Since(since), err
		}
		if err := dispatch(n.Channel, n.Payload); err != nil {
			return time.Since(since), err
		}
	}
}

// Listener LISTENs on several channels over one connection, for the
// subscribers of each. Every notification of a database wakes every
// session LISTENing there, whatever its channel (PostgreSQL signals them
// all, and each reads the queue for its own channels): one connection for
// a process's channels is one session woken per notification instead of
// one per channel, and one connection held instead of several.
//
// Run holds the connection and connects again when it is lost, as Listen
// does; Subscribe hands a channel's notifications to its caller while Run
// hears them.
type Listener struct {
	config   *pgx.ConnConfig
	log      *slog.Logger
	channels []string

	mu      sync.Mutex
	subs    map[string][]*subscriber
	hearing bool
}

type subscriber struct {
	fn        func(payload string) error
	listening func(bool)
}

// NewListener returns a listener on config's database (a pool's config),
// for channels.
func NewListener(config *pgx.ConnConfig, log *slog.Logger, channels ...string) *Listener {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Listener{config: config, log: log, channels: slices.Clone(channels), subs: map[string][]*subscriber{}}
}

// Run LISTENs on the listener's channels until ctx ends, and returns
// ctx's error.
func (l *Listener) Run(ctx context.Context) error {
	return run(ctx, l.config, l.channels, l.log, l.dispatch, l.setHearing)
}

// Subscribe calls fn with the payload of each notification on channel, in
// the order PostgreSQL delivers them, until ctx ends; then it returns
// ctx's error. listening, if set, is told whether the listener hears its
// channels: at once when it does, and at each change (false when ctx
// ends, if it was told true). An error from fn is logged, and the
// notification dropped; the other subscribers are not disturbed. A
// channel the listener was not made for is an error. fn and listening are
// called one at a time, never after Subscribe has returned, and must not
// block.
func (l *Listener) Subscribe(ctx context.Context, channel string, fn func(payload string) error, listening func(bool)) error {
	if !slices.Contains(l.channels, channel) {
		return fmt.Errorf("pglisten: no LISTEN on channel %q (listening on %s)", channel, strings.Join(l.channels, ", "))
	}
	if listening == nil {
		listening = func(bool) {}
	}
	s := &subscriber{fn: fn, listening: listening}
	l.mu.Lock()
	l.subs[channel] = append(l.subs[channel], s)
	if l.hearing {
		s.listening(true)
	}
	l.mu.Unlock()
	<-ctx.Done()
	l.mu.Lock()
	l.subs[channel] = slices.DeleteFunc(l.subs[channel], func(x *subscriber) bool { return x == s })
	if l.hearing {
		s.listening(false)
	}
	l.mu.Unlock()
	return ctx.Err()
}

// dispatch hands a notification to its channel's subscribers. It holds
// the lock meanwhile, so that none is called once Subscribe has returned.
func (l *Listener) dispatch(channel, payload string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.subs[channel] {
		if err := s.fn(payload); err != nil {
			l.log.Warn("a notification was not understood; dropped", "channel", channel, "error", err)
		}
	}
	return nil
}

// setHearing tells every subscriber whether the connection listens.
func (l *Listener) setHearing(on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.hearing == on {
		return
	}
	l.hearing = on
	for _, subs := range l.subs {
		for _, s := range subs {
			s.listening(on)
		}
	}
}
