// Package jsonnul finds the JSON texts PostgreSQL's jsonb refuses that
// encoding/json accepts: a string holding U+0000, written \u0000; a
// surrogate escape that is not half of a pair (\ud800 alone, or a low half
// first); and bytes that are not UTF-8 ([Refused]). [RefusedText] does the
// same for a name stored as text (a stream, a type, a record id), which
// holds no NUL either: a guest's "\u0000" in one decodes to a NUL byte.
//
// jsonb stores strings as PostgreSQL text, which cannot hold a NUL, so an
// insert fails with "unsupported Unicode escape sequence" (22P05); a lone
// surrogate fails with "invalid input syntax for type json" (22P02), and
// bytes that are not UTF-8 with 22021. A guest writes such text easily (a
// string cut in the middle of an emoji by a UTF-16 language). The memory
// stores would keep such a document and the PostgreSQL ones would fail
// with a database error, which the engine takes for a failing database,
// not a failing message, and retries without end; the stores check with
// [Refused] first, so that both refuse it the same way, before the
// database, with their ErrInvalid.
package jsonnul
