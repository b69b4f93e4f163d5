package unitofwork

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/record"
)

// DefaultGroupCommit is the most commands one grouped transaction carries
// when Options.GroupCommit is 0.
const DefaultGroupCommit = 64

// grouper is group commit for commands (Commit, not fenced): a command
// that finds no commit of its group in flight commits at once, alone;
// commands that arrive while one is in flight queue, and when it ends the
// first of them (the leader) commits up to max of the queue in one
// transaction, then hands the rest to the next leader. There is no timer:
// a lone command never waits, and a busy group's batch grows with the
// time a commit takes.
//
// A group is the sorted set of categories a command appends to, so a
// grouped transaction takes the category locks each of its commands takes
// alone, no more. Its record writes are sorted by key like every unit of
// work's (sortWrites), so holding several commands' rows adds no lock
// order that could deadlock.
type grouper struct {
	max int

	mu     sync.Mutex
	groups map[string]*group // present while a commit of the group is in flight
}

type group struct {
	queue []*member // waiting; the head is promoted to lead the next batch
}

// member is a queued command. The fields below ctx and s are the grouper's
// (promoted, sent) under its mu, or written once before done is closed.
type member struct {
	ctx  context.Context
	s    *stage
	lead chan struct{} // closed when promoted: commit the next batch
	done chan struct{} // closed when the outcome is set

	promoted, sent bool

	out   Committed
	err   error
	alone bool // the batch failed and committed nothing: commit alone
}

func newGrouper(max int) *grouper {
	return &grouper{max: max, groups: make(map[string]*group)}
}

// groupKey is the sorted set of categories s appends to.
func groupKey(s *stage) string {
	categories := make([]string, 0, 1)
	for _, ev := range s.events {
		categories = append(categories, eventstore.Category(ev.Stream))
	}
	slices.Sort(categories)
	return strings.Join(slices.Compact(categories), "\x00")
}

// commit commits s, grouped with the commands of its group that queue
// behind a commit in flight.
func (g *grouper) commit(ctx context.Context, u *UnitOfWork, s *stage) (Committed, error) {
	key := groupKey(s)
	g.mu.Lock()
	grp, busy := g.groups[key]
	if !busy {
		g.groups[key] = &group{}
		g.mu.Unlock()
		out, err := u.commitOne(ctx, s)
		g.handOff(key)
		return out, err
	}
	m := &member{ctx: ctx, s: s, lead: make(chan struct{}), done: make(chan struct{})}
	grp.queue = append(grp.queue, m)
	g.mu.Unlock()
	select {
	case <-m.done:
		return m.result(u)
	case <-m.lead:
		return g.leadBatch(u, key, m)
	case <-ctx.Done():
		if g.leave(key, m) {
			return Committed{}, ctx.Err()
		}
		<-m.done // sent: it shares its batch's outcome
		return m.result(u)
	}
}

// result is a member's outcome once done is closed: its batch's, or its
// own commit when the batch failed without committing.
func (m *member) result(u *UnitOfWork) (Committed, error) {
	if m.alone {
		// Each member commits alone in its own caller, concurrently: one
		// command's conflict or refusal fails that command only.
		return u.commitOne(m.ctx, m.s)
	}
	return m.out, m.err
}

// leave takes a member whose context ended out of its queue, unless its
// stage was sent already (then it reports false). A promoted member passes
// the lead on.
func (g *grouper) leave(key string, m *member) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if m.sent {
		return false
	}
	grp := g.groups[key]
	grp.queue = slices.DeleteFunc(grp.queue, func(q *member) bool { return q == m })
	if m.promoted {
		g.promoteLocked(key, grp)
	}
	return true
}

// handOff ends a commit of key: the queue's head leads the next batch, or
// the group goes idle.
func (g *grouper) handOff(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.promoteLocked(key, g.groups[key])
}

func (g *grouper) promoteLocked(key string, grp *group) {
	if len(grp.queue) == 0 {
		delete(g.groups, key)
		return
	}
	head := grp.queue[0]
	head.promoted = true
	close(head.lead)
}

// leadBatch commits, in one transaction, m (the queue's head) and the
// members behind it, up to max, and hands the group on. If the
// transaction fails with anything but ErrCommitUnknown nothing was
// committed, and each member commits alone.
func (g *grouper) leadBatch(u *UnitOfWork, key string, m *member) (Committed, error) {
	g.mu.Lock()
	grp := g.groups[key]
	if err := m.ctx.Err(); err != nil {
		grp.queue = grp.queue[1:]
		g.promoteLocked(key, grp)
		g.mu.Unlock()
		return Committed{}, err
	}
	n := min(len(grp.queue), g.max)
	batch := slices.Clone(grp.queue[:n])
	grp.queue = slices.Clone(grp.queue[n:])
	for _, b := range batch {
		b.sent = true
	}
	g.mu.Unlock()
	if n == 1 {
		out, err := u.commitOne(m.ctx, m.s)
		g.handOff(key)
		return out, err
	}
	stages := make([]*stage, n)
	for i, b := range batch {
		stages[i] = b.s
	}
	ctx, stop := together(batch)
	out, err := u.commitStages(ctx, stages)
	stop()
	for i, b := range batch {
		switch {
		case err == nil:
			b.out = out[i]
		case errors.Is(err, ErrCommitUnknown):
			b.err = err // it may have committed: never twice
		default:
			b.alone = true
		}
		if i > 0 {
			close(b.done)
		}
	}
	g.handOff(key)
	return m.result(u)
}

// together is the context a batch's transaction runs under: it ends when
// every member's has ended, so one caller that gives up does not cancel
// the others' commit (once sent, a member shares its batch's outcome).
func together(batch []*member) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(batch[0].ctx))
	var left atomic.Int64
	left.Store(int64(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, m := range batch {
		stops[i] = context.AfterFunc(m.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// sortWrites orders writes by record key, keeping the order of the writes
// to one record (chained versions). Every unit of work locks its records'
// rows in this one order, before its category locks in theirs, so a
// grouped commit (several commands' rows in one transaction) or a run
// waits on no lock that anyone could hold while waiting for one of its
// own.
func sortWrites(writes []record.Write) {
	slices.SortStableFunc(writes, func(a, b record.Write) int {
		if c := strings.Compare(a.Key.Kind, b.Key.Kind); c != 0 {
			return c
		}
		if c := strings.Compare(a.Key.Type, b.Key.Type); c != 0 {
			return c
		}
		return strings.Compare(a.Key.ID, b.Key.ID)
	})
}
