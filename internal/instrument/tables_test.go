package instrument_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/instrument"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// A table without a maximum gets the limit as its maximum (the rewritten
// module parses, and rewriting it again changes nothing); one within the
// limit is returned as it is; one over it, by its start or its maximum,
// is ErrTableLimit; a table section that does not parse is ErrMalformed.
func TestBoundTables(t *testing.T) {
	t.Parallel()
	code := []byte{0x41, 0} // i32.const 0

	open := wasmbuild.RawModule(10, -1, code)
	out, err := instrument.BoundTables(open, 1000)
	require.NoError(t, err)
	require.NotEqual(t, open, out, "a table without a maximum is rewritten")
	require.Equal(t, wasmbuild.RawModule(10, 1000, code), out, "the limit is its maximum, nothing else changes")
	again, err := instrument.BoundTables(out, 1000)
	require.NoError(t, err)
	require.Equal(t, out, again)

	within := wasmbuild.RawModule(10, 500, code)
	out, err = instrument.BoundTables(within, 1000)
	require.NoError(t, err)
	require.True(t, &out[0] == &within[0] && len(out) == len(within), "a module within the limit is returned as it is")

	_, err = instrument.BoundTables(wasmbuild.RawModule(2000, -1, code), 1000)
	require.ErrorIs(t, err, instrument.ErrTableLimit)
	require.ErrorContains(t, err, "starts at 2000 elements (limit 1000)")
	_, err = instrument.BoundTables(wasmbuild.RawModule(10, 2000, code), 1000)
	require.ErrorIs(t, err, instrument.ErrTableLimit)
	require.ErrorContains(t, err, "may grow to 2000 elements (limit 1000)")

	// The table section's entry cut short: count 1, then a funcref with no
	// limits.
	bad := wasmbuild.RawModule(10, 500, code)
	table := []byte{4, 6, 1, 0x70, 1, 10, 0xf4, 3} // id, size, count, funcref, min 10, max 500
	i := bytes.Index(bad, table)
	require.GreaterOrEqual(t, i, 0, "the table section of the raw module")
	bad = append(append(bytes.Clone(bad[:i]), 4, 2, 1, 0x70), bad[i+len(table):]...)
	_, err = instrument.BoundTables(bad, 1000)
	require.ErrorIs(t, err, instrument.ErrMalformed)
}
