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

// DefaultGroupCommit is the most steps (a command's commit, a message of a
// run) one grouped transaction carries when Options.GroupCommit is 0.
const DefaultGroupCommit = 64

// grouper is group commit across callers: commands (Commit) and
// consumers' runs (CommitRun; a partition unit's, say, while other units
// commit theirs). A caller that finds no commit of its group in flight
// commits at once, alone; callers that arrive while one is in flight
// queue, and when it ends the first of them (the leader) commits the
// queue's members, up to max steps, in one transaction, then hands the
// rest to the next leader. There is no timer: a lone caller never waits,
// and a busy group's batch grows with the time a commit takes.
//
// A group is the sorted set of categories a member appends to, so a
// grouped transaction takes the category locks each of its members takes
// alone, no more. Its record writes are sorted by key like every unit of
// work's (sortWrites), so holding several members' rows adds no lock
// order that could deadlock; a run's fences are its own unit's, which no
// other caller's run commits at the same time (one worker per unit).
type grouper struct {
	max int

	mu     sync.Mutex
	groups map[string]*group // present while a commit of the group is in flight
}

type group struct {
	queue []*member // waiting; the head is promoted to lead the next batch
}

// member is a queued caller: a command's stage, or a run's stages. The
// fields below alone are the grouper's (promoted, sent) under its mu, or
// written once before done is closed.
type member struct {
	ctx    context.Context
	stages []*stage
	// alone commits the member's stages without the group, as it would
	// have with no group: a command's commitOne, a run's commitRunAlone.
	alone func(context.Context) ([]Committed, error)
	lead  chan struct{} // closed when promoted: commit the next batch
	done  chan struct{} // closed when the outcome is set

	promoted, sent bool

	out  []Committed
	err  error
	solo bool // the batch failed and committed nothing: commit alone
}

func newGrouper(max int) *grouper {
	return &grouper{max: max, groups: make(map[string]*group)}
}

// groupKey is the sorted set of categories stages append to.
func groupKey(stages []*stage) string {
	categories := make([]string, 0, 1)
	for _, s := range stages {
		for _, ev := range s.events {
			categories = append(categories, eventstore.Category(ev.Stream))
		}
	}
	slices.Sort(categories)
	return strings.Join(slices.Compact(categories), "\x00")
}

// commit commits stages, grouped with the members of their group that
// queue behind a commit in flight; alone commits them without the group
// (see member).
func (g *grouper) commit(ctx context.Context, u *UnitOfWork, stages []*stage, alone func(context.Context) ([]Committed, error)) ([]Committed, error) {
	key := groupKey(stages)
	g.mu.Lock()
	grp, busy := g.groups[key]
	if !busy {
		g.groups[key] = &group{}
		g.mu.Unlock()
		out, err := alone(ctx)
		g.handOff(key)
		return out, err
	}
	m := &member{ctx: ctx, stages: stages, alone: alone, lead: make(chan struct{}), done: make(chan struct{})}
	grp.queue = append(grp.queue, m)
	g.mu.Unlock()
	select {
	case <-m.done:
		return m.result()
	case <-m.lead:
		return g.leadBatch(u, key, m)
	case <-ctx.Done():
		if g.leave(key, m) {
			return nil, ctx.Err()
		}
		<-m.done // sent: it shares its batch's outcome
		return m.result()
	}
}

// result is a member's outcome once done is closed: its batch's, or its
// own commit when the batch failed without committing.
func (m *member) result() ([]Committed, error) {
	if m.solo {
		// Each member commits alone in its own caller, concurrently: one
		// command's conflict or refusal (or one run's) fails it only.
		return m.alone(m.ctx)
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
// members behind it, up to max steps (m's at least), and hands the group
// on. If the transaction fails with anything but ErrCommitUnknown nothing
// was committed, and each member commits alone.
func (g *grouper) leadBatch(u *UnitOfWork, key string, m *member) ([]Committed, error) {
	g.mu.Lock()
	grp := g.groups[key]
	if err := m.ctx.Err(); err != nil {
		grp.queue = grp.queue[1:]
		g.promoteLocked(key, grp)
		g.mu.Unlock()
		return nil, err
	}
	n, steps := 1, len(m.stages)
	for n < len(grp.queue) && steps+len(grp.queue[n].stages) <= g.max {
		steps += len(grp.queue[n].stages)
		n++
	}
	batch := slices.Clone(grp.queue[:n])
	grp.queue = slices.Clone(grp.queue[n:])
	for _, b := range batch {
		b.sent = true
	}
	g.mu.Unlock()
	if n == 1 {
		out, err := m.alone(m.ctx)
		g.handOff(key)
		return out, err
	}
	stages := make([]*stage, 0, steps)
	for _, b := range batch {
		stages = append(stages, b.stages...)
	}
	ctx, stop := together(batch)
	out, err := u.commitStages(ctx, stages)
	stop()
	for i, b := range batch {
		switch {
		case err == nil:
			b.out, out = out[:len(b.stages):len(b.stages)], out[len(b.stages):]
		case errors.Is(err, ErrCommitUnknown):
			b.err = err // it may have committed: never twice
		default:
			b.solo = true
		}
		if i > 0 {
			close(b.done)
		}
	}
	g.handOff(key)
	return m.result()
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
