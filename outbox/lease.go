package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/proteanhq/protean-host/internal/pglisten"
)

// DefaultLeaseFor is how long a relay's lease of its broker lasts unless
// renewed ([RelayLeaser]; relay.Options.LeaseFor).
const DefaultLeaseFor = 5 * time.Second

// lease is a broker's relay lease in the memory store.
type lease struct {
	owner   string
	expires time.Time
}

var (
	_ RelayWaker = (*Memory)(nil)
	_ RelayWaker = (*Postgres)(nil)
)

// HoldRelay implements RelayLeaser.
func (m *Memory) HoldRelay(ctx context.Context, broker, owner string, leaseFor time.Duration) (bool, error) {
	if err := ownerArgs(ctx, "hold relay lease", broker, owner); err != nil {
		return false, err
	}
	if leaseFor <= 0 {
		leaseFor = DefaultLeaseFor
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	if l, ok := m.leases[broker]; ok && l.owner != owner && now.Before(l.expires) {
		return false, nil
	}
	if m.leases == nil {
		m.leases = map[string]lease{}
	}
	m.leases[broker] = lease{owner: owner, expires: now.Add(leaseFor)}
	return true, nil
}

// ReleaseRelay implements RelayLeaser.
func (m *Memory) ReleaseRelay(ctx context.Context, broker, owner string) error {
	if err := ownerArgs(ctx, "release relay lease", broker, owner); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if l, ok := m.leases[broker]; ok && l.owner == owner {
		delete(m.leases, broker)
	}
	return nil
}

// holdRelaySQL takes or renews a broker's lease ($1) for $2 until $4,
// unless another owner's lease lasts past $3 (now): one statement, so
// that two relays that try at once cannot both take it.
const holdRelaySQL = `INSERT INTO outbox_relay_leases AS l (target_broker, owner, expires_at) VALUES ($1, $2, $4)
	ON CONFLICT (target_broker) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at
		WHERE l.owner = excluded.owner OR l.expires_at <= $3
	RETURNING true`

// HoldRelay implements RelayLeaser.
func (p *Postgres) HoldRelay(ctx context.Context, broker, owner string, leaseFor time.Duration) (bool, error) {
	if err := ownerArgs(ctx, "hold relay lease", broker, owner); err != nil {
		return false, err
	}
	if leaseFor <= 0 {
		leaseFor = DefaultLeaseFor
	}
	now := p.db.Now()
	var held bool
	err := p.db.Pool.QueryRow(ctx, holdRelaySQL, broker, owner, now, now.Add(leaseFor)).Scan(&held)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("outbox: hold relay lease: %w", err)
	}
	return held, nil
}

// ReleaseRelay implements RelayLeaser.
func (p *Postgres) ReleaseRelay(ctx context.Context, broker, owner string) error {
	if err := ownerArgs(ctx, "release relay lease", broker, owner); err != nil {
		return err
	}
	if _, err := p.db.Pool.Exec(ctx, `DELETE FROM outbox_relay_leases WHERE target_broker = $1 AND owner = $2`, broker, owner); err != nil {
		return fmt.Errorf("outbox: release relay lease: %w", err)
	}
	return nil
}

// WakeRelay implements RelayWaker.
func (m *Memory) WakeRelay(ctx context.Context, broker string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, w := range m.wakes[broker] {
		select {
		case w <- struct{}{}:
		default: // a wake is pending already
		}
	}
	return nil
}

// ListenRelayWakes implements RelayWaker.
func (m *Memory) ListenRelayWakes(ctx context.Context, broker string, _ *slog.Logger, fn func()) error {
	w := make(chan struct{}, 1)
	m.mu.Lock()
	if m.wakes == nil {
		m.wakes = map[string][]chan struct{}{}
	}
	m.wakes[broker] = append(m.wakes[broker], w)
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.wakes[broker] = slices.DeleteFunc(m.wakes[broker], func(c chan struct{}) bool { return c == w })
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-w:
			fn()
		}
	}
}

// RelayWakeChannel is the notification channel of the relays' wake-ups;
// a payload is the broker's name.
const RelayWakeChannel = "protean_outbox_relay"

// Subscriber hands a channel's notifications to its caller over a
// connection it shares with the process's other listeners
// (pglisten.Listener.Subscribe): fn with each payload until ctx ends,
// listening told whether the connection hears.
type Subscriber interface {
	Subscribe(ctx context.Context, channel string, fn func(payload string) error, listening func(bool)) error
}

// ListenOver makes ListenRelayWakes subscribe to RelayWakeChannel on s, a
// listener of the process's that LISTENs on it, instead of holding a
// connection of its own. Call it before the relays start.
func (p *Postgres) ListenOver(s Subscriber) { p.wakes = s }

// WakeRelay implements RelayWaker: a notification on RelayWakeChannel.
func (p *Postgres) WakeRelay(ctx context.Context, broker string) error {
	if _, err := p.db.Pool.Exec(ctx, `SELECT pg_notify($1, $2)`, RelayWakeChannel, broker); err != nil {
		return fmt.Errorf("outbox: wake relay: %w", err)
	}
	return nil
}

// ListenRelayWakes implements RelayWaker: it subscribes to
// RelayWakeChannel on the process's listener (ListenOver), or else a
// connection of its own LISTENs on it (pglisten.Listen).
func (p *Postgres) ListenRelayWakes(ctx context.Context, broker string, log *slog.Logger, fn func()) error {
	wake := func(payload string) error {
		if payload == broker {
			fn()
		}
		return nil
	}
	if p.wakes != nil {
		return p.wakes.Subscribe(ctx, RelayWakeChannel, wake, nil)
	}
	return pglisten.Listen(ctx, p.db.Pool.Config().ConnConfig, RelayWakeChannel, log, wake, nil)
}
