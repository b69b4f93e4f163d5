package position

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/proteanhq/protean-host/internal/txdone"
)

// Row is one consumer group's state for one unit.
type Row struct {
	Group string
	Unit  string
	// Generation is the current owner's fencing generation: 1 after the
	// first Claim, 0 for a row an operator created with Set before any
	// owner claimed it.
	Generation int64
	// Positions maps each source stream to the global position of the last
	// message whose effects committed. Never nil in a returned Row.
	Positions map[string]int64
	UpdatedAt time.Time
}

// Fence is what an effect transaction checks and applies: the owner's
// generation must still be the row's, and each source of Advance must move
// forward to the given global position.
type Fence struct {
	Group      string
	Unit       string
	Generation int64
	// Advance maps a source stream to its new position. An empty Advance
	// checks the generation only.
	Advance map[string]int64
}

var (
	// ErrFenced means the row's generation is not the fence's: a newer
	// owner claimed the unit (or the row does not exist). The effect
	// transaction must roll back; the caller has lost the unit.
	ErrFenced = errors.New("fenced: the unit has a newer owner")
	// ErrApplied means a source's new position is at or below the recorded
	// one: the message was applied already. The effect transaction must
	// roll back; the caller acks the message without applying it.
	ErrApplied = errors.New("already applied")
	// ErrInvalid means an argument is empty or out of range.
	ErrInvalid = errors.New("invalid argument")
	// ErrTxDone means a transaction was used after Commit or Rollback. It
	// is the one sentinel every store shares (errors.Is holds across them).
	ErrTxDone = txdone.Err
)

// FenceError is an ErrFenced with the generations: Have is the row's (0 if
// the row is missing), Want the fence's.
type FenceError struct {
	Group, Unit string
	Have, Want  int64
}

func (e *FenceError) Error() string {
	return fmt.Sprintf("position %s/%s: generation %d, fence holds %d: %v", e.Group, e.Unit, e.Have, e.Want, ErrFenced)
}

// Unwrap returns ErrFenced.
func (e *FenceError) Unwrap() error { return ErrFenced }

// AppliedError is an ErrApplied with the positions of one source: Have is
// the recorded one, Want the fence's.
type AppliedError struct {
	Group, Unit, Source string
	Have, Want          int64
}

func (e *AppliedError) Error() string {
	return fmt.Sprintf("position %s/%s: source %s at %d, fence advances to %d: %v", e.Group, e.Unit, e.Source, e.Have, e.Want, ErrApplied)
}

// Unwrap returns ErrApplied.
func (e *AppliedError) Unwrap() error { return ErrApplied }

// Fenced reports whether err means the caller lost its unit to a newer
// owner: it must stop handling the unit's messages and not ack them.
func Fenced(err error) bool { return errors.Is(err, ErrFenced) }

// Applied reports whether err means the fenced message was applied
// already: the caller acks it and goes on.
func Applied(err error) bool { return errors.Is(err, ErrApplied) }

// Reader reads the table of consumer positions: what operators and a
// consumer that only reads (lag, inspect, read-your-writes) need.
type Reader interface {
	// Get returns the unit's row, and false if it has none.
	Get(ctx context.Context, group, unit string) (Row, bool, error)
}

// Rows reads each (group, unit) row at most once through Reader: the
// positions one check sees (read-your-writes asks about many events of a
// unit in one pass).
type Rows struct {
	Reader Reader
	seen   map[[2]string]Row
}

// Get returns group's row of unit (an empty row if it has none), read at
// the first call.
func (r *Rows) Get(ctx context.Context, group, unit string) (Row, error) {
	k := [2]string{group, unit}
	if row, ok := r.seen[k]; ok {
		return row, nil
	}
	row, _, err := r.Reader.Get(ctx, group, unit)
	if err != nil {
		return Row{}, err
	}
	if r.seen == nil {
		r.seen = map[[2]string]Row{}
	}
	r.seen[k] = row
	return row, nil
}

// Store is the table of consumer positions outside any effect transaction.
// The fenced advance happens inside one, through the implementation's Tx
// view ([MemoryTx.Advance], [PostgresTx.Advance]), because it must commit
// with the effects.
type Store interface {
	// Claim makes the caller the unit's owner: it creates the row at
	// generation 1 with no positions, or bumps its generation by 1, and
	// returns the row after. A new owner calls it before handling anything,
	// so that every fence of an older owner fails from then on, and reads
	// where to resume from the returned positions.
	Claim(ctx context.Context, group, unit string) (Row, error)
	// ClaimAll claims each of units as Claim does, all in one call (one
	// statement per ClaimAllChunk units on PostgreSQL), and returns their
	// rows in units' order: a host that acquired many units at once (a
	// start, a takeover) claims them without a round trip each. units may
	// not repeat one; none claims nothing.
	ClaimAll(ctx context.Context, group string, units []string) ([]Row, error)
	Reader
	// List returns a group's rows ("" for every group), ordered by group,
	// then unit (byte order). For `partitions list` and subscription
	// status.
	List(ctx context.Context, group string) ([]Row, error)
	// Set moves one source's position by hand (an operator's skip, or a
	// subscription started at a chosen position). It may move it backwards
	// (to replay) and does not bump the generation, so the owner keeps
	// running; a missing row is created at generation 0.
	Set(ctx context.Context, group, unit, source string, pos int64) error
}

func validUnit(group, unit string) error {
	if group == "" || unit == "" {
		return fmt.Errorf("position: group %q, unit %q: both must be non-empty: %w", group, unit, ErrInvalid)
	}
	return nil
}

// validUnits checks ClaimAll's units: each valid, none twice.
func validUnits(group string, units []string) error {
	seen := make(map[string]bool, len(units))
	for _, u := range units {
		if err := validUnit(group, u); err != nil {
			return err
		}
		if seen[u] {
			return fmt.Errorf("position %s/%s: claimed twice in one call: %w", group, u, ErrInvalid)
		}
		seen[u] = true
	}
	return nil
}

func validSet(group, unit, source string, pos int64) error {
	if err := validUnit(group, unit); err != nil {
		return err
	}
	if source == "" {
		return fmt.Errorf("position %s/%s: empty source: %w", group, unit, ErrInvalid)
	}
	if pos < 0 {
		return fmt.Errorf("position %s/%s: source %s: position %d < 0: %w", group, unit, source, pos, ErrInvalid)
	}
	return nil
}

func validFence(f Fence) error {
	if err := validUnit(f.Group, f.Unit); err != nil {
		return err
	}
	if f.Generation < 1 {
		return fmt.Errorf("position %s/%s: fence generation %d < 1: %w", f.Group, f.Unit, f.Generation, ErrInvalid)
	}
	for src, pos := range f.Advance {
		if src == "" || pos < 0 {
			return fmt.Errorf("position %s/%s: advance source %q to %d: %w", f.Group, f.Unit, src, pos, ErrInvalid)
		}
	}
	return nil
}

// check returns the error a fence meets on a row with generation have and
// positions recorded (exists false: no row). Sources are checked in sorted
// order, so both implementations name the same one.
func check(f Fence, exists bool, have int64, recorded map[string]int64) error {
	if !exists {
		have = 0
	}
	if !exists || have != f.Generation {
		return &FenceError{Group: f.Group, Unit: f.Unit, Have: have, Want: f.Generation}
	}
	for _, src := range slices.Sorted(maps.Keys(f.Advance)) {
		if old, ok := recorded[src]; ok && f.Advance[src] <= old {
			return &AppliedError{Group: f.Group, Unit: f.Unit, Source: src, Have: old, Want: f.Advance[src]}
		}
	}
	return nil
}
