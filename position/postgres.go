package position

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/internal/pgstore"
	"github.com/proteanhq/protean-host/internal/pipeline"
	"github.com/proteanhq/protean-host/internal/txdone"
)

// Postgres is a Store in the consumer_positions table of a database
// migrated by package schema. It is safe for concurrent use, by many hosts.
//
// Claim and Set are one statement each, in a transaction of their own. The
// fenced advance runs in the caller's effect transaction through
// [Postgres.Tx]: its UPDATE takes the row lock, so a concurrent Claim waits
// for the effect transaction to end and then sees what it committed, and a
// stale owner's advance waits for the Claim and then finds the new
// generation.
//
// Time is the injected clock's, never the database's now().
type Postgres struct {
	db     pgstore.Store
	notify bool // Notifying
}

var _ Store = (*Postgres)(nil)

// NewPostgres returns a store on pool's database that reads time from now;
// nil means time.Now.
func NewPostgres(pool *pgxpool.Pool, now func() time.Time) *Postgres {
	return &Postgres{db: pgstore.New(pool, now)}
}

// Tx returns a view of the table inside tx, the caller's transaction.
func (p *Postgres) Tx(tx pgx.Tx) *PostgresTx { return &PostgresTx{db: p.db.In(tx), notify: p.notify} }

const rowColumns = `consumer_group, unit, generation, positions, updated_at`

func scanRow(row pgx.Row) (Row, error) {
	var r Row
	if err := row.Scan(&r.Group, &r.Unit, &r.Generation, &r.Positions, &r.UpdatedAt); err != nil {
		return Row{}, err
	}
	if r.Positions == nil {
		r.Positions = map[string]int64{}
	}
	r.UpdatedAt = r.UpdatedAt.UTC()
	return r, nil
}

// Claim implements Store: ClaimAll of one unit.
func (p *Postgres) Claim(ctx context.Context, group, unit string) (Row, error) {
	rows, err := p.ClaimAll(ctx, group, []string{unit})
	if err != nil {
		return Row{}, err
	}
	return rows[0], nil
}

// ClaimAllChunk is how many units one statement of ClaimAll claims at
// most.
const ClaimAllChunk = 1000

// ClaimAll implements Store: one INSERT ... ON CONFLICT DO UPDATE for up
// to ClaimAllChunk units, each statement its own transaction. The rows
// are inserted in unit order, so that two hosts claiming overlapping sets
// lock their rows in one order.
func (p *Postgres) ClaimAll(ctx context.Context, group string, units []string) ([]Row, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := validUnits(group, units); err != nil {
		return nil, err
	}
	byUnit := make(map[string]Row, len(units))
	for chunk := range slices.Chunk(units, ClaimAllChunk) {
		rows, _ := p.db.Pool.Query(ctx, `INSERT INTO consumer_positions (consumer_group, unit, generation, positions, updated_at)
			SELECT $1, u, 1, '{}', $3 FROM unnest($2::text[]) AS u ORDER BY u
			ON CONFLICT (consumer_group, unit) DO UPDATE
			SET generation = consumer_positions.generation + 1, updated_at = EXCLUDED.updated_at
			RETURNING `+rowColumns, group, chunk, p.db.Now())
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) { return scanRow(r) })
		if err != nil {
			if len(chunk) == 1 {
				return nil, fmt.Errorf("position %s/%s: claim: %w", group, chunk[0], err)
			}
			return nil, fmt.Errorf("position %s: claim %d units: %w", group, len(chunk), err)
		}
		for _, r := range got {
			byUnit[r.Unit] = r
		}
	}
	out := make([]Row, len(units))
	for i, u := range units {
		r, ok := byUnit[u]
		if !ok {
			return nil, fmt.Errorf("position %s/%s: claim: no row returned", group, u)
		}
		out[i] = r
	}
	return out, nil
}

// Set implements Store: one INSERT ... ON CONFLICT DO UPDATE.
func (p *Postgres) Set(ctx context.Context, group, unit, source string, pos int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validSet(group, unit, source, pos); err != nil {
		return err
	}
	_, err := p.db.Pool.Exec(ctx, `INSERT INTO consumer_positions (consumer_group, unit, generation, positions, updated_at)
		VALUES ($1, $2, 0, jsonb_build_object($3::text, $4::bigint), $5)
		ON CONFLICT (consumer_group, unit) DO UPDATE
		SET positions = consumer_positions.positions || EXCLUDED.positions, updated_at = EXCLUDED.updated_at`,
		group, unit, source, pos, p.db.Now())
	if err != nil {
		return fmt.Errorf("position %s/%s: set %s: %w", group, unit, source, err)
	}
	return nil
}

// Get implements Store.
func (p *Postgres) Get(ctx context.Context, group, unit string) (Row, bool, error) {
	if err := ctx.Err(); err != nil {
		return Row{}, false, err
	}
	if err := validUnit(group, unit); err != nil {
		return Row{}, false, err
	}
	r, err := scanRow(p.db.Pool.QueryRow(ctx, `SELECT `+rowColumns+` FROM consumer_positions WHERE consumer_group = $1 AND unit = $2`, group, unit))
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, false, nil
	}
	if err != nil {
		return Row{}, false, fmt.Errorf("position %s/%s: get: %w", group, unit, err)
	}
	return r, true, nil
}

// List implements Store. Byte order (COLLATE "C"), as the memory store
// sorts, whatever the database's collation.
func (p *Postgres) List(ctx context.Context, group string) ([]Row, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rows, err := p.db.Pool.Query(ctx, `SELECT `+rowColumns+` FROM consumer_positions
		WHERE $1 = '' OR consumer_group = $1
		ORDER BY consumer_group COLLATE "C", unit COLLATE "C"`, group)
	if err != nil {
		return nil, fmt.Errorf("position: list %q: %w", group, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Row, error) { return scanRow(row) })
	if err != nil {
		return nil, fmt.Errorf("position: list %q: %w", group, err)
	}
	if out == nil {
		out = []Row{}
	}
	return out, nil
}

// PostgresTx is the table inside a caller's pgx transaction. Like the
// pgx.Tx under it, it is for one goroutine at a time.
type PostgresTx struct {
	db     pgstore.Tx
	notify bool
}

// advanceSQL moves the positions to $4 only while the generation is the
// fence's and every source of $6 is behind where $6 takes it (for one
// fence $6 is $4; for a fold, where its first fence moves each source
// from); a source the row lacks moves from nothing. It matches no row
// otherwise, and fails no statement, so the transaction needs no
// savepoint.
const advanceSQL = `UPDATE consumer_positions c
	SET positions = c.positions || $4::jsonb, updated_at = $5
	WHERE c.consumer_group = $1 AND c.unit = $2 AND c.generation = $3
	  AND NOT EXISTS (
	    SELECT 1 FROM jsonb_each_text($6::jsonb) AS n(source, pos)
	    WHERE (c.positions ->> n.source)::bigint >= n.pos::bigint)`

// queuedAdvanceSQL is advanceSQL raising when the fence does not hold;
// one statement stands for a run of fences (fold).
var queuedAdvanceSQL = pipeline.Count(advanceSQL, "1", "fence")

// queueNotify queues, when the store is Notifying, the notifications of
// the folds' advances on b (they go out if the transaction commits), and
// returns the reader of their results.
func (p *Postgres) queueNotify(b *pgx.Batch, folds []folded) (pipeline.Reader, error) {
	if !p.notify {
		return func(pgx.BatchResults) error { return nil }, nil
	}
	advances := make([]Advanced, 0, len(folds))
	for _, f := range folds {
		if len(f.Advance) > 0 { // a generation check alone moves nothing
			advances = append(advances, Advanced{Group: f.Group, Unit: f.Unit, Positions: f.Advance})
		}
	}
	ps, err := payloads(advances)
	if err != nil {
		return nil, err
	}
	for _, payload := range ps {
		b.Queue(notifySQL, Channel, payload)
	}
	return func(br pgx.BatchResults) error {
		for range ps {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("position: notify %s: %w", Channel, err)
			}
		}
		return nil
	}, nil
}

// advanceAllSQL is advanceSQL for arrays of folds ($1, $2, $3, $4 and $6
// hold each one's group, unit, generation, positions and check), in array
// order: the rows of a grouped transaction's runs, one statement for all
// of them. queuedAdvanceAllSQL raises unless it changed a row per fold:
// refused exactly when one of the statements one by one would be (a fence
// that does not hold; two folds of one unit, which fold leaves apart only
// when the second would not move a source forward, change one row). The
// LIMIT, which drops no row, keeps its plan a nested loop into the primary
// key at any table size, as record's updateAllSQL explains.
const advanceAllSQL = `UPDATE consumer_positions c
	SET positions = c.positions || f.set::jsonb, updated_at = $5
	FROM (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $6::text[]) AS u(grp, unit, gen, set, chk)
		LIMIT cardinality($1::text[])) f
	WHERE c.consumer_group = f.grp AND c.unit = f.unit AND c.generation = f.gen
	  AND NOT EXISTS (
	    SELECT 1 FROM jsonb_each_text(f.chk::jsonb) AS n(source, pos)
	    WHERE (c.positions ->> n.source)::bigint >= n.pos::bigint)`

var queuedAdvanceAllSQL = pipeline.Count(advanceAllSQL, "cardinality($1::text[])", "fences")

// folded is a run of fences of one unit and generation as one: the
// positions the first of them moves each source from (check) and the
// positions the last moves it to (Advance).
type folded struct {
	Fence
	check map[string]int64
}

// fold folds each unit's fences, in order, into one where that changes
// nothing: a fence of the unit and generation of an earlier one, whose
// every source moves past where the earlier ones left it, goes into it.
// The run's messages, each with its fence, then advance the positions
// row once, not once per message: the same row afterwards, and refused
// exactly when the fences one by one would be (the generation does not
// hold, or a source is already at or past where the first fence that
// moves it takes it). A fence that would not move a source forward starts
// a fold of its own, after the other, so the pipeline refuses it as it
// would have.
func fold(fences []Fence) []folded {
	type unit struct {
		group, unit string
		gen         int64
	}
	out := make([]folded, 0, len(fences))
	last := make(map[unit]int, len(fences))
	for _, f := range fences {
		u := unit{f.Group, f.Unit, f.Generation}
		if i, ok := last[u]; ok && forward(out[i].Advance, f.Advance) {
			for src, pos := range f.Advance {
				if _, seen := out[i].check[src]; !seen {
					out[i].check[src] = pos
				}
				out[i].Advance[src] = pos
			}
			continue
		}
		last[u] = len(out)
		advance, check := maps.Clone(f.Advance), maps.Clone(f.Advance)
		if advance == nil { // a generation check only
			advance, check = map[string]int64{}, map[string]int64{}
		}
		out = append(out, folded{Fence: Fence{Group: f.Group, Unit: f.Unit, Generation: f.Generation, Advance: advance}, check: check})
	}
	return out
}

// forward reports whether next moves every source it names past where
// sofar leaves it.
func forward(sofar, next map[string]int64) bool {
	for src, pos := range next {
		if at, ok := sofar[src]; ok && pos <= at {
			return false
		}
	}
	return true
}

// maxAdvanceTries bounds the re-runs of the UPDATE when the diagnosis finds
// nothing wrong: an operator's Set moved a position back between the two
// statements. Twice is already rare.
const maxAdvanceTries = 3

// Advance checks f and moves the positions, in the caller's transaction:
// one UPDATE when it succeeds; when it matches no row, a SELECT finds which
// error applies: *FenceError if the generation differs or the row is
// missing, *AppliedError if a source would not move forward. A failed
// Advance changes nothing, and the transaction stays usable.
func (t *PostgresTx) Advance(ctx context.Context, f Fence) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validFence(f); err != nil {
		return err
	}
	advance := f.Advance
	if advance == nil {
		advance = map[string]int64{}
	}
	js, err := json.Marshal(advance)
	if err != nil {
		return err
	}
	for range maxAdvanceTries {
		tag, err := t.db.Tx.Exec(ctx, advanceSQL, f.Group, f.Unit, f.Generation, string(js), t.db.Now(), string(js))
		if err != nil {
			return t.mapError(f, err)
		}
		if tag.RowsAffected() == 1 {
			return t.notifyAdvanced(ctx, f)
		}
		var (
			gen       int64
			positions map[string]int64
		)
		err = t.db.Tx.QueryRow(ctx, `SELECT generation, positions FROM consumer_positions WHERE consumer_group = $1 AND unit = $2`,
			f.Group, f.Unit).Scan(&gen, &positions)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return check(f, false, 0, nil)
		case err != nil:
			return t.mapError(f, err)
		}
		if err := check(f, true, gen, positions); err != nil {
			return err
		}
	}
	return fmt.Errorf("position %s/%s: advance: the row kept changing under the check", f.Group, f.Unit)
}

// Forget removes source from the unit's row in the caller's transaction
// if the row holds generation, and reports whether it does; a missing
// row, another generation or an absent source change nothing. It is for a
// source that served once and will never be advanced again (a rerun's own
// source, subscription.RetrySource, once its failure record is resolved):
// every source stays in the row, and the row is rewritten by every effect
// transaction. The generation check leaves the source to a newer owner,
// which may still need it to recognise a repeat.
func (t *PostgresTx) Forget(ctx context.Context, group, unit string, generation int64, source string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := validUnit(group, unit); err != nil {
		return false, err
	}
	tag, err := t.db.Tx.Exec(ctx, `UPDATE consumer_positions SET positions = positions - $4::text, updated_at = $5
		WHERE consumer_group = $1 AND unit = $2 AND generation = $3`, group, unit, generation, source, t.db.Now())
	if err != nil {
		if txdone.Closed(err) {
			return false, ErrTxDone
		}
		return false, fmt.Errorf("position %s/%s: forget %s: %w", group, unit, source, err)
	}
	return tag.RowsAffected() == 1, nil
}

// notifyAdvanced notifies Channel of f's advance, in the transaction,
// when the store is Notifying.
func (t *PostgresTx) notifyAdvanced(ctx context.Context, f Fence) error {
	if !t.notify || len(f.Advance) == 0 {
		return nil
	}
	ps, err := payloads([]Advanced{{Group: f.Group, Unit: f.Unit, Positions: f.Advance}})
	if err != nil {
		return err
	}
	for _, p := range ps {
		if _, err := t.db.Tx.Exec(ctx, notifySQL, Channel, p); err != nil {
			return t.mapError(f, err)
		}
	}
	return nil
}

func (t *PostgresTx) mapError(f Fence, err error) error {
	if txdone.Closed(err) {
		return ErrTxDone
	}
	return fmt.Errorf("position %s/%s: advance: %w", f.Group, f.Unit, err)
}

// QueueAdvance queues the fences' checks and advances on b, a pipeline
// inside a transaction, as one statement for all the folds of each unit's
// fences (fold; advanceAllSQL, or advanceSQL for one fold), and returns
// the reader of their results, which fails when a fence does not hold
// (without saying why: run Advance to learn the *FenceError or
// *AppliedError). The statement is Advance's wrapped to raise when it
// does not change a row per fold, so that nothing queued after it runs, a
// COMMIT least of all. It takes the units' rows in one order, by group
// and unit, so that two grouped transactions with units in common (a run
// of a unit's stale owner in one) cannot wait for each other.
func (p *Postgres) QueueAdvance(b *pgx.Batch, fences ...Fence) (pipeline.Reader, error) {
	for _, f := range fences {
		if err := validFence(f); err != nil {
			return nil, err
		}
	}
	folds := fold(fences)
	slices.SortStableFunc(folds, func(a, b folded) int {
		return cmp.Or(strings.Compare(a.Group, b.Group), strings.Compare(a.Unit, b.Unit))
	})
	n := len(folds)
	groups, units, gens := make([]string, n), make([]string, n), make([]int64, n)
	sets, checks := make([]string, n), make([]string, n)
	for i, f := range folds {
		set, err := json.Marshal(f.Advance)
		if err != nil {
			return nil, err
		}
		check, err := json.Marshal(f.check)
		if err != nil {
			return nil, err
		}
		groups[i], units[i], gens[i], sets[i], checks[i] = f.Group, f.Unit, f.Generation, string(set), string(check)
	}
	notified, err := p.queueNotify(b, folds)
	if err != nil {
		return nil, err
	}
	all := n > 1 // one statement for every fold (advanceAllSQL)
	statements := n
	if all {
		b.Queue(queuedAdvanceAllSQL, groups, units, gens, sets, p.db.Now(), checks)
		statements = 1
	} else {
		for i := range folds {
			b.Queue(queuedAdvanceSQL, groups[i], units[i], gens[i], sets[i], p.db.Now(), checks[i])
		}
	}
	return func(br pgx.BatchResults) error {
		if err := notified(br); err != nil {
			return err
		}
		for i := range statements {
			if _, err := br.Exec(); err != nil {
				if pipeline.Refused(err) {
					err = pipeline.ErrRefused
				}
				if all {
					return fmt.Errorf("position: advance %d units from %s/%s: %w", n, groups[0], units[0], err)
				}
				return fmt.Errorf("position %s/%s: advance: %w", groups[i], units[i], err)
			}
		}
		return nil
	}, nil
}
