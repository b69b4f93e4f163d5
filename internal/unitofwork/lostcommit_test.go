package unitofwork_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/unitofwork"
)

// commitCutter is a TCP proxy in front of PostgreSQL that, when armed,
// closes the connection that carries the server's answer to a COMMIT
// instead of passing it on: the transaction is committed, and the client
// cannot know it.
type commitCutter struct {
	ln    net.Listener
	to    string
	armed atomic.Bool
	pass  atomic.Int64 // answers to COMMIT to pass on, armed, before the cut
	cut   atomic.Int64
	wg    sync.WaitGroup
}

func newCommitCutter(t *testing.T, to string) *commitCutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	c := &commitCutter{ln: ln, to: to}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", to)
			if err != nil {
				client.Close()
				continue
			}
			c.wg.Add(2)
			go func() {
				defer c.wg.Done()
				_, _ = io.Copy(server, client)
				server.Close()
			}()
			go func() {
				defer c.wg.Done()
				defer client.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := server.Read(buf)
					if n > 0 {
						// CommandComplete "COMMIT": the server has committed.
						if bytes.Contains(buf[:n], []byte("COMMIT\x00")) && c.armed.Load() && c.pass.Add(-1) < 0 &&
							c.armed.CompareAndSwap(true, false) {
							c.cut.Add(1)
							server.Close()
							return
						}
						if _, werr := client.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); c.wg.Wait() })
	return c
}

// A unit of work whose connection fails after PostgreSQL committed it
// (the answer to COMMIT lost) has an unknown outcome: it must not be
// committed a second time. The one-round-trip commit once fell back to
// the step-by-step path on any error, which appended the events again
// (under new ids, when the guest gave none) and reported success; with
// ids given, it reported a duplicate id for a unit that had committed.
func TestPostgresLostCommitAnswerIsNotCommittedTwice(t *testing.T) {
	t.Parallel()
	for _, run := range []bool{false, true} {
		t.Run(fmt.Sprintf("run=%v", run), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			direct, pool, cutter := cutPool(t)
			u := unitofwork.New(unitofwork.NewPostgres(pool), unitofwork.Options{Broker: "default", MaxRetries: 3})
			_, err := u.Commit(ctx, noted(0)) // the connection is up and its statements prepared
			require.NoError(t, err)

			cutter.armed.Store(true)
			if run {
				_, err = u.CommitRun(ctx, []unitofwork.Step{{Changes: []unitofwork.Change{noted(1)}}, {Changes: []unitofwork.Change{noted(2)}}})
			} else {
				_, err = u.Commit(ctx, noted(1))
			}
			require.Equal(t, int64(1), cutter.cut.Load(), "the answer to COMMIT was cut")
			require.Error(t, err, "the outcome is unknown: not a success")
			require.ErrorIs(t, err, unitofwork.ErrCommitUnknown)
			var events, rows int
			require.NoError(t, direct.QueryRow(ctx, `SELECT (SELECT count(*) FROM message_store.messages WHERE stream_name <> 'note-0'),
				(SELECT count(*) FROM outbox WHERE stream_name <> 'note-0')`).Scan(&events, &rows))
			want := 1
			if run {
				want = 2
			}
			require.Equal(t, want, events, "the unit was committed once, by the lost COMMIT")
			require.Equal(t, want, rows)
		})
	}
}

// cutPool returns a pool on a fresh database and a second pool on it
// through a commitCutter.
func cutPool(t *testing.T) (direct, cut *pgxpool.Pool, cutter *commitCutter) {
	t.Helper()
	direct = testserver.PostgresPool(t)
	cfg := direct.Config()
	cutter = newCommitCutter(t, fmt.Sprintf("%s:%d", cfg.ConnConfig.Host, cfg.ConnConfig.Port))
	host, port, err := net.SplitHostPort(cutter.ln.Addr().String())
	require.NoError(t, err)
	cfg.ConnConfig.Host = host
	_, err = fmt.Sscan(port, &cfg.ConnConfig.Port)
	require.NoError(t, err)
	cfg.ConnConfig.Fallbacks = nil
	cfg.MaxConns = 16
	cut, err = pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(cut.Close)
	return direct, cut, cutter
}

// noted is a command appending one event to note-n.
func noted(n int) unitofwork.Change {
	return unitofwork.Change{Effects: &abi.Effects{Events: []abi.NewEvent{{Stream: fmt.Sprintf("note-%d", n), Type: "Noted",
		Data: json.RawMessage(`{}`)}}}}
}

// A group whose answer to COMMIT is lost has an unknown outcome: every
// member gets ErrCommitUnknown and none is committed again (each once, by
// the lost COMMIT). Falling back to lone commits after it fails it.
func TestPostgresLostGroupCommitIsNotCommittedTwice(t *testing.T) {
	t.Parallel()
	ctx := testwait.Context(t)
	direct, pool, cutter := cutPool(t)
	u := unitofwork.New(unitofwork.NewPostgres(pool), unitofwork.Options{Broker: "default", MaxRetries: 3})
	r := &groupRig{pool: direct, u: u}
	release := r.hold(t, "note")
	first := r.start(ctx, noted(0))
	r.inFlight(t)
	const n = 3
	outs := make([]<-chan outcome, n)
	for i := range outs {
		outs[i] = r.start(ctx, noted(i+1))
	}
	r.queued(t, n)
	cutter.pass.Store(1) // the first commit's answer, then the group's is cut
	cutter.armed.Store(true)
	release()
	require.NoError(t, testwait.Recv(t, "the first commit", first).err)
	for _, ch := range outs {
		require.ErrorIs(t, testwait.Recv(t, "a grouped commit", ch).err, unitofwork.ErrCommitUnknown)
	}
	require.Equal(t, int64(1), cutter.cut.Load())
	require.Equal(t, n+1, r.count(t, `SELECT count(*) FROM message_store.messages`), "each once, by the lost COMMIT")
	require.Equal(t, n+1, r.count(t, `SELECT count(*) FROM outbox`))
}
