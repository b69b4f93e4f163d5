// Package pipeline is the seam between the PostgreSQL stores and the unit
// of work's pipelined commit: each store queues its statements of a unit
// of work on one pgx.Batch (Queue… methods) and hands back a [Reader] of
// their results, so that a whole unit of work, COMMIT included, is sent
// in one round trip instead of one per step.
//
// A pipelined step only tells success from refusal: a refused write (an
// expected version that does not hold, a fence that does not, a duplicate
// id) reads as [ErrRefused], without the typed error. The unit of work
// then rolls back and runs the same work step by step, whose errors say
// exactly what went wrong. Refusals are the rare path; the common path
// pays no round trip for them.
//
// A refusal must raise, not merely change nothing: PostgreSQL skips the
// rest of a pipeline after a statement fails, so a COMMIT queued behind a
// refused step never runs, while a statement that quietly matched no row
// would let the COMMIT keep the rest of the unit of work without it. A
// pipelined statement raises by a constraint where it can (a duplicate
// violates a unique index; an append at the wrong version computes a NULL
// position), and otherwise through [Count], which wraps a conditional
// statement so that it raises when it changed the wrong number of rows, in
// plain SQL: no function of our own, so no migration. [Refused] tells
// these errors from others.
package pipeline

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrRefused means a pipelined statement matched nothing or returned no
// row where success changes or returns one: the work must be retried step
// by step to learn its typed error.
var ErrRefused = errors.New("refused in a pipelined unit of work")

// Reader reads, in order, the results of the statements one Queue… call
// put on a batch.
type Reader func(br pgx.BatchResults) error

// marker starts the message of a refusal raised by [Unless].
const marker = "protean refused: "

// Unless returns an SQL boolean expression that is true when cond holds
// and raises a refusal (what: plain words, no quotes) otherwise. The raise
// is a cast of text that is not a boolean: PostgreSQL has no raise in
// plain SQL. CASE runs its ELSE only when reached, and detail, a text
// expression the message ends with, must name a value of the query (a
// count): then the planner cannot fold the cast into an error at plan
// time, as it would a constant.
func Unless(cond, what, detail string) string {
	return `CASE WHEN ` + cond + ` THEN true ELSE ('` + marker + what + `: ' || ` + detail + `)::boolean END`
}

// Count returns a statement that runs dml (an INSERT or UPDATE without a
// RETURNING clause) and returns one row, or raises unless dml changed
// want rows (an SQL expression: "1"). what names the step in the
// refusal's message.
func Count(dml, want, what string) string {
	return `WITH w AS (` + dml + ` RETURNING 1), c AS (SELECT count(*) AS n FROM w)
	SELECT c.n FROM c WHERE ` + Unless(`c.n = `+want, what, `c.n || ' rows'`)
}

// Refused reports whether err is a refusal: raised by [Unless] (or
// [Count]), or a unique or not-null violation.
func Refused(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "23505", "23502": // unique_violation, not_null_violation
		return true
	case "22P02": // invalid_text_representation: Unless's failed cast
		return strings.Contains(pgErr.Message, marker)
	}
	return false
}
