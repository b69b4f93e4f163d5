package pglisten

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// heard is what one subscriber was told.
type heard struct {
	mu        sync.Mutex
	payloads  []string
	listening []bool
}

func (h *heard) fn(payload string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.payloads = append(h.payloads, payload)
	return nil
}

func (h *heard) told(on bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.listening = append(h.listening, on)
}

func (h *heard) got() ([]string, []bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.payloads...), append([]bool(nil), h.listening...)
}

func (h *heard) hearing() bool {
	_, l := h.got()
	return len(l) > 0 && l[len(l)-1]
}

// listenerOn starts a listener for channels on a new database, named by
// application_name so that its sessions can be counted.
func listenerOn(t *testing.T, channels ...string) (*Listener, *pgxpool.Pool) {
	t.Helper()
	pool := testserver.PostgresPool(t)
	config := pool.Config().ConnConfig.Copy()
	config.RuntimeParams["application_name"] = "pglisten-test"
	l := NewListener(config, nil, channels...)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return l, pool
}

// subscribe runs l.Subscribe until the returned stop, which waits for it.
func subscribe(l *Listener, channel string, h *heard, fn func(string) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = l.Subscribe(ctx, channel, fn, h.told)
	}()
	return func() {
		cancel()
		<-done
	}
}

func notify(t *testing.T, pool *pgxpool.Pool, channel, payload string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `SELECT pg_notify($1, $2)`, channel, payload)
	require.NoError(t, err)
}

func sessions(t *testing.T, pool *pgxpool.Pool) (n int, pid int32) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*), coalesce(max(pid), 0) FROM pg_stat_activity
		WHERE application_name = 'pglisten-test' AND datname = current_database()`).Scan(&n, &pid))
	return n, pid
}

// TestListenerSharesOneConnection: subscribers of two channels hear their
// own channel's notifications, in order, over one session.
func TestListenerSharesOneConnection(t *testing.T) {
	t.Parallel()
	l, pool := listenerOn(t, "chan_a", "chan_b")
	var a, b1, b2 heard
	defer subscribe(l, "chan_a", &a, a.fn)()
	defer subscribe(l, "chan_b", &b1, b1.fn)()
	defer subscribe(l, "chan_b", &b2, b2.fn)()
	testwait.True(t, "every subscriber told the listener hears", func() bool { return a.hearing() && b1.hearing() && b2.hearing() })

	notify(t, pool, "chan_a", "a1")
	notify(t, pool, "chan_b", "b1")
	notify(t, pool, "chan_a", "a2")
	testwait.True(t, "every notification heard", func() bool {
		pa, _ := a.got()
		pb1, _ := b1.got()
		pb2, _ := b2.got()
		return len(pa) == 2 && len(pb1) == 1 && len(pb2) == 1
	})
	pa, _ := a.got()
	pb1, _ := b1.got()
	pb2, _ := b2.got()
	assert.Equal(t, []string{"a1", "a2"}, pa)
	assert.Equal(t, []string{"b1"}, pb1)
	assert.Equal(t, []string{"b1"}, pb2)
	n, _ := sessions(t, pool)
	assert.Equal(t, 1, n, "sessions of the listener")
}

// TestListenerHearsAgainAfterALostConnection: a lost session is connected
// again; the subscribers are told it stopped and started hearing, and hear
// what is sent after.
func TestListenerHearsAgainAfterALostConnection(t *testing.T) {
	t.Parallel()
	l, pool := listenerOn(t, "chan_a")
	var a heard
	defer subscribe(l, "chan_a", &a, a.fn)()
	testwait.True(t, "the subscriber told the listener hears", a.hearing)
	_, pid := sessions(t, pool)
	_, err := pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	testwait.True(t, "the subscriber told it stopped, then started again", func() bool {
		_, told := a.got()
		return len(told) >= 3 && told[len(told)-1]
	})
	_, told := a.got()
	assert.Equal(t, []bool{true, false, true}, told)
	notify(t, pool, "chan_a", "after")
	testwait.True(t, "the notification after the reconnect heard", func() bool {
		p, _ := a.got()
		return len(p) == 1 && p[0] == "after"
	})
}

// TestASubscriberThatFailsDisturbsNoOther: a subscriber's error drops its
// notification; the connection stays, and the others hear on.
func TestASubscriberThatFailsDisturbsNoOther(t *testing.T) {
	t.Parallel()
	l, pool := listenerOn(t, "chan_a")
	var bad, good heard
	defer subscribe(l, "chan_a", &bad, func(string) error { return errors.New("not understood") })()
	defer subscribe(l, "chan_a", &good, good.fn)()
	testwait.True(t, "both told the listener hears", func() bool { return bad.hearing() && good.hearing() })
	notify(t, pool, "chan_a", "1")
	notify(t, pool, "chan_a", "2")
	testwait.True(t, "the other subscriber heard both", func() bool {
		p, _ := good.got()
		return len(p) == 2
	})
	_, told := good.got()
	assert.Equal(t, []bool{true}, told, "the connection was never lost")
}

// TestSubscribeEnds: a subscriber that left hears nothing more and is told
// it stopped hearing; a channel the listener does not LISTEN on is
// refused.
func TestSubscribeEnds(t *testing.T) {
	t.Parallel()
	l, pool := listenerOn(t, "chan_a")
	var gone, stays heard
	stop := subscribe(l, "chan_a", &gone, gone.fn)
	defer subscribe(l, "chan_a", &stays, stays.fn)()
	testwait.True(t, "both told the listener hears", func() bool { return gone.hearing() && stays.hearing() })
	stop()
	notify(t, pool, "chan_a", "late")
	testwait.True(t, "the one that stays heard it", func() bool {
		p, _ := stays.got()
		return len(p) == 1
	})
	p, told := gone.got()
	assert.Empty(t, p)
	assert.Equal(t, []bool{true, false}, told)

	err := l.Subscribe(context.Background(), "chan_other", func(string) error { return nil }, nil)
	assert.ErrorContains(t, err, `no LISTEN on channel "chan_other"`)
}
