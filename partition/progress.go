package partition

import (
	"context"
	"strings"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/readyourwrites"
	"github.com/proteanhq/protean-host/position"
)

// Progress is the partition workers' read-your-writes source
// (readyourwrites.Source). A run's effects commit with its unit's position
// in the consumer-positions table, whichever host instance ran it, so an
// event is handled once the positions row of its unit (its partition, or a
// correlated process manager's value) has reached it for the event's
// partition stream or one of that stream's lanes. The engine gives a
// partition's events one priority, so they all travel one lane: the
// highest position of the stream and its lanes is the unit's.
type Progress struct {
	Positions position.Reader
	// Local, if set, is this process's partition workers: a unit it runs
	// answers how far it has committed without a read
	// (readyourwrites.LocalCheck). Set it before the first wait.
	Local LocalUnits
}

// LocalUnits is this process's partition workers, as read-your-writes
// asks them.
type LocalUnits interface {
	// Committed is, when this process runs group's unit now, the highest
	// position the unit has committed on any of its streams, as far as its
	// worker knows (never past the positions row); ok is false otherwise.
	Committed(group, unit string) (at int64, ok bool)
}

// Check implements readyourwrites.Source: it reads each unit's row once.
func (p *Progress) Check(string, int64) readyourwrites.Check {
	return &progressCheck{rows: position.Rows{Reader: p.Positions}, local: p.Local}
}

// Remote implements readyourwrites.Source: other host instances' runs
// show only in the positions table.
func (p *Progress) Remote() bool { return true }

type progressCheck struct {
	rows  position.Rows
	local LocalUnits
}

// LocalKeyPosition implements readyourwrites.LocalCheck for the units of
// one partition key (not a correlated process manager's, whose row spans
// the streams of several categories).
func (c *progressCheck) LocalKeyPosition(r readyourwrites.Route, key string) (int64, bool) {
	if c.local == nil || r.Correlated {
		return 0, false
	}
	return c.local.Committed(r.Group, UnitOf(r.Group, r.Category, key, false))
}

// Handled implements readyourwrites.Check.
func (c *progressCheck) Handled(ctx context.Context, r readyourwrites.Route, ev eventstore.Event) (bool, error) {
	if r.Field == "" {
		return false, nil
	}
	key, ok := FieldKey(ev.Data, r.Field)
	if !ok {
		return false, nil
	}
	at, err := c.position(ctx, r, key)
	return at >= ev.GlobalPosition, err
}

// KeyPosition implements readyourwrites.Check: a key's events are one
// unit's, applied in publish order.
func (c *progressCheck) KeyPosition(ctx context.Context, r readyourwrites.Route, key string) (int64, bool, error) {
	at, err := c.position(ctx, r, key)
	return at, err == nil, err
}

// position is how far the unit of key's events in r.Category has committed
// r.Group's effects: the highest position its row records for the key's
// partition stream or one of its lanes ({stream}:{suffix}).
func (c *progressCheck) position(ctx context.Context, r readyourwrites.Route, key string) (int64, error) {
	unit, stream := UnitOf(r.Group, r.Category, key, r.Correlated), StreamName(r.Category, key)
	row, err := c.rows.Get(ctx, r.Group, unit)
	if err != nil {
		return 0, err
	}
	var at int64
	for src, pos := range row.Positions {
		if (src == stream || strings.HasPrefix(src, stream+":")) && pos > at {
			at = pos
		}
	}
	return at, nil
}
