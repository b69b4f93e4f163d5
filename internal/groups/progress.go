package groups

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/readyourwrites"
)

// Progress is the groups' read-your-writes source (the inline broker, a
// Redis stream's groups for an unpartitioned category). The groups record
// nothing durable: an event appended before this process started its
// groups was delivered by an earlier process, or never will be (the inline
// broker keeps nothing across a restart), so it counts as handled, or a
// restarted host would wait on it for ever. What this process handles
// after, the engine marks. Before Start, nothing counts as handled.
//
// The composition root makes one and gives it to both the engine
// (engine.Options.BrokerProgress) and the Consumer (Options.Progress).
type Progress struct {
	startedAt atomic.Int64 // unix ns; 0 before Start
}

// start records when the groups started; a nil Progress keeps nothing.
func (p *Progress) start(t time.Time) {
	if p != nil {
		p.startedAt.Store(t.UnixNano())
	}
}

// Check begins a check: the groups keep nothing to read.
func (p *Progress) Check(string, int64) readyourwrites.Check { return p }

// Remote is false: other processes' handling does not show here.
func (p *Progress) Remote() bool { return false }

// Handled reports whether ev was appended before the groups started.
func (p *Progress) Handled(_ context.Context, _ readyourwrites.Route, ev eventstore.Event) (bool, error) {
	since := p.startedAt.Load()
	return since != 0 && ev.Time.UnixNano() < since, nil
}

// KeyPosition is never known: the groups do not deliver by key.
func (p *Progress) KeyPosition(context.Context, readyourwrites.Route, string) (int64, bool, error) {
	return 0, false, nil
}
