package position_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/proteanhq/protean-host/internal/pglisten"
	"github.com/proteanhq/protean-host/internal/pipeline"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/position"
)

// TestNotifyingStoreAnnouncesCommittedAdvances pins the notifications a
// notifying store sends: a listener on another connection receives the
// advances of a committed transaction (pipelined, several units in one,
// and step by step), and nothing of one that was refused or rolled back.
func TestNotifyingStoreAnnouncesCommittedAdvances(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testserver.PostgresPool(t)
	s := position.NewPostgres(pool, time.Now).Notifying()
	claim(t, s, "a", "b")
	got := make(chan []position.Advanced, 16)
	lctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	l := pglisten.NewListener(pool.Config().ConnConfig, nil, position.Channel)
	go func() { _ = l.Run(lctx) }()
	go func() {
		done <- l.Subscribe(lctx, position.Channel, position.Advances(func(a []position.Advanced) { got <- a }), nil)
	}()
	defer func() {
		stop()
		if err := testwait.Recv(t, "the subscription's end", done); !errors.Is(err, context.Canceled) {
			t.Errorf("Subscribe returned %v", err)
		}
	}()
	fence := func(unit string, pos int64) position.Fence {
		return position.Fence{Group: "g", Unit: unit, Generation: 1, Advance: map[string]int64{"s:" + unit: pos}}
	}
	queue := func(fences ...position.Fence) error { return queueAdvance(t, pool, s, fences...) }
	// The listener is up once a notification of ours arrives: send one
	// until it does (LISTEN runs on its own connection, in its own time).
	n := int64(0)
	testwait.True(t, "the listener receives a committed advance", func() bool {
		n++
		if err := queue(fence("a", n)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-got:
			return true
		case <-time.After(20 * time.Millisecond):
			return false
		}
	})
	for len(got) > 0 { // late ones of the warm-up
		<-got
	}
	// Refused: nothing is announced.
	if err := queue(fence("a", 1), fence("b", 1)); !errors.Is(err, pipeline.ErrRefused) {
		t.Fatalf("a stale position: got %v, want a refusal", err)
	}
	// Committed, two units in one statement: both, in one notification.
	if err := queue(fence("a", n+10), fence("b", 5)); err != nil {
		t.Fatal(err)
	}
	want := []position.Advanced{{Group: "g", Unit: "a", Positions: map[string]int64{"s:a": n + 10}}, {Group: "g", Unit: "b", Positions: map[string]int64{"s:b": 5}}}
	if a := testwait.Recv(t, "the committed advance", got); !equal(a, want) {
		t.Fatalf("notified %+v, want %+v (and nothing of the refused one)", a, want)
	}
	// Step by step (the unit of work's path after a refusal); a rolled
	// back transaction announces nothing.
	step := func(f position.Fence, commit bool) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Tx(tx).Advance(ctx, f); err != nil {
			t.Fatal(err)
		}
		end := tx.Rollback
		if commit {
			end = tx.Commit
		}
		if err := end(ctx); err != nil {
			t.Fatal(err)
		}
	}
	step(fence("b", 6), false)
	step(fence("b", 7), true)
	want = []position.Advanced{{Group: "g", Unit: "b", Positions: map[string]int64{"s:b": 7}}}
	if a := testwait.Recv(t, "the step-by-step advance", got); !equal(a, want) {
		t.Fatalf("notified %+v, want %+v (and nothing of the rolled back one)", a, want)
	}
}

func equal(a, b []position.Advanced) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}
