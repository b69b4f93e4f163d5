package subscription

import (
	"context"
	"fmt"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/readyourwrites"
	"github.com/proteanhq/protean-host/position"
)

// Progress is the event-store subscriptions' read-your-writes source
// (readyourwrites.Source). A subscription's unit and source are its
// category, so an event is handled once the category's positions row has
// passed it, whichever host instance's subscription ran it.
//
// The position also passes an event the subscription recorded as failed
// (or held behind a failure of its key) and went on from, so the check
// reads the group's open failure records too. Such an event is not
// handled, and nothing will handle it until an operator acts: it is a
// *FailedError, which ends the wait at once (the API answers 500) rather
// than answer a document without the event's effects, or wait into the
// bound as if the projector were only slow. An event an operator set to
// retry is waited for (its rerun is on its way); one skipped counts as
// handled (the operator gave it up: the projection is final without it,
// and later reads must not fail on it for ever).
type Progress struct {
	Positions position.Reader
	// Failures are the subscriptions' failure records (nil: none kept).
	Failures interface {
		List(ctx context.Context, group, unit string, open bool) ([]Failure, error)
	}
}

// Check implements readyourwrites.Source: it reads each category's row
// and open failures once.
func (p *Progress) Check(projection string, n int64) readyourwrites.Check {
	return &progressCheck{p: p, projection: projection, position: n,
		rows: position.Rows{Reader: p.Positions}, open: map[string]map[int64]Failure{}}
}

// Remote implements readyourwrites.Source: other host instances'
// subscriptions show only in the positions table.
func (p *Progress) Remote() bool { return true }

type progressCheck struct {
	p          *Progress
	projection string
	position   int64
	rows       position.Rows
	open       map[string]map[int64]Failure
}

// Handled implements readyourwrites.Check.
func (c *progressCheck) Handled(ctx context.Context, r readyourwrites.Route, ev eventstore.Event) (bool, error) {
	unit := r.Category
	row, err := c.rows.Get(ctx, r.Group, unit)
	if err != nil {
		return false, err
	}
	if row.Positions[unit] < ev.GlobalPosition {
		return false, nil
	}
	return c.notFailed(ctx, r.Group, unit, ev.GlobalPosition)
}

// KeyPosition implements readyourwrites.Check: a category's subscription
// keeps one position for all its keys, so it cannot say by key.
func (c *progressCheck) KeyPosition(context.Context, readyourwrites.Route, string) (int64, bool, error) {
	return 0, false, nil
}

// notFailed reports whether the event at gp, which group's subscription
// of unit has passed, was handled rather than recorded as failed.
func (c *progressCheck) notFailed(ctx context.Context, group, unit string, gp int64) (bool, error) {
	if c.p.Failures == nil {
		return true, nil
	}
	open, seen := c.open[unit]
	if !seen {
		fs, err := c.p.Failures.List(ctx, group, unit, true)
		if err != nil {
			return false, err
		}
		open = make(map[int64]Failure, len(fs))
		for _, f := range fs {
			open[f.GlobalPosition] = f
		}
		c.open[unit] = open
	}
	f, failed := open[gp]
	switch {
	case !failed:
		return true, nil
	case f.Status == StatusRetry:
		return false, nil
	}
	return false, &FailedError{Projection: c.projection, Position: c.position, Failure: f}
}

// FailedError is readyourwrites.ErrFailed with the wait and the failure
// record.
type FailedError struct {
	Projection string
	Position   int64
	Failure    Failure
}

func (e *FailedError) Error() string {
	f := e.Failure
	what := "failed"
	if f.Status == StatusHeld {
		what = "holds, behind an earlier failure of its key,"
	}
	return fmt.Sprintf("projection %s cannot reach global position %d: its handler %s the %s event at global position %d (stream %s): an operator must retry or skip it (protean-host subscriptions failed)",
		e.Projection, e.Position, what, f.Type, f.GlobalPosition, f.Stream)
}

// Unwrap returns readyourwrites.ErrFailed.
func (e *FailedError) Unwrap() error { return readyourwrites.ErrFailed }
