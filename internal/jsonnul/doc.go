// Package jsonnul finds the one JSON text PostgreSQL's jsonb refuses that
// encoding/json accepts: a string holding U+0000, written \u0000.
//
// jsonb stores strings as PostgreSQL text, which cannot hold a NUL, so an
// insert fails with "unsupported Unicode escape sequence" (22P05). The
// memory stores would keep such a document and the PostgreSQL ones would
// fail with a database error; the stores check with [Has] first, so that
// both refuse it the same way, before the database, with their ErrInvalid.
package jsonnul
