// Package pipeline is the seam between the PostgreSQL stores and the unit
// of work's pipelined commit: each store queues its statements of a unit
// of work on one pgx.Batch (Queue… methods) and hands back a [Reader] of
// their results, so a whole unit of work costs two round trips instead of
// one per step.
//
// A pipelined step only tells success from refusal: a refused write (an
// expected version that does not hold, a fence that does not, a duplicate
// id) reads as [ErrRefused], without the typed error. The unit of work
// then rolls back and runs the same work step by step, whose errors say
// exactly what went wrong. Refusals are the rare path; the common path
// pays no round trip for them.
package pipeline

import (
	"errors"

	"github.com/jackc/pgx/v5"
)

// ErrRefused means a pipelined statement matched nothing or returned no
// row where success changes or returns one: the work must be retried step
// by step to learn its typed error.
var ErrRefused = errors.New("refused in a pipelined unit of work")

// Reader reads, in order, the results of the statements one Queue… call
// put on a batch.
type Reader func(br pgx.BatchResults) error
