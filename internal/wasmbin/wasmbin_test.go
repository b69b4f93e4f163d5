package wasmbin

import (
	"bytes"
	"io"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestU32(t *testing.T) {
	t.Parallel()
	for _, v := range []uint32{0, 1, 0x7F, 0x80, 0x3FFF, 0x4000, 1<<28 - 1, 1 << 28, 1<<32 - 1} {
		got, n, err := u32(AppendU32(nil, v))
		require.NoError(t, err)
		require.Equal(t, v, got)
		require.Equal(t, len(AppendU32(nil, v)), n)
	}
	for name, p := range map[string][]byte{
		"empty":     nil,
		"cut short": {0x80},
		"too large": {0xFF, 0xFF, 0xFF, 0xFF, 0x1F}, // 2^33-1
		"too long":  {0x80, 0x80, 0x80, 0x80, 0x80, 0x00},
	} {
		_, _, err := u32(p)
		require.Error(t, err, name)
	}
}

func TestSections(t *testing.T) {
	t.Parallel()
	m := append([]byte{0, 'a', 's', 'm', 1, 0, 0, 0}, 1, 4, 1, 0x60, 0, 0)
	m = AppendCustom(m, "name", []byte("xy"))
	secs, err := Sections(m)
	require.NoError(t, err)
	require.Len(t, secs, 2)
	require.Equal(t, byte(1), secs[0].ID)
	require.Equal(t, []byte{1, 0x60, 0, 0}, secs[0].Payload)
	require.Equal(t, m[secs[1].At:secs[1].End], m[14:])
	name, content, err := CustomName(secs[1].Payload)
	require.NoError(t, err)
	require.Equal(t, "name", name)
	require.Equal(t, "xy", string(content))

	_, err = Sections(m[:len(m)-1])
	require.ErrorIs(t, err, ErrMalformed)
	_, err = Sections([]byte{0, 'a', 's', 'm', 2, 0, 0, 0})
	require.ErrorIs(t, err, ErrVersion)
}

// sameWalk requires SectionsAt and CustomNameAt, reading b through an
// io.ReaderAt, to find what Sections and CustomName find in b.
func sameWalk(t *testing.T, b []byte) {
	t.Helper()
	secs, err := Sections(b)
	at, errAt := SectionsAt(bytes.NewReader(b), int64(len(b)))
	require.Equal(t, err, errAt)
	require.Len(t, at, len(secs))
	for i, s := range secs {
		require.Equal(t, SectionAt{ID: s.ID, At: int64(s.At), Payload: int64(s.End - len(s.Payload)), End: int64(s.End)}, at[i])
		if s.ID != CustomID {
			continue
		}
		name, content, err := CustomName(s.Payload)
		nameAt, contentAt, errAt := CustomNameAt(bytes.NewReader(b), at[i])
		require.Equal(t, err, errAt)
		if err == nil {
			require.Equal(t, name, nameAt)
			require.Equal(t, int64(s.End-len(content)), contentAt)
		}
	}
}

func TestSectionsAtReadsHeadersOnly(t *testing.T) {
	t.Parallel()
	m := append([]byte{0, 'a', 's', 'm', 1, 0, 0, 0}, 1, 4, 1, 0x60, 0, 0)
	m = AppendCustom(m, "name", []byte("xy"))
	for _, b := range [][]byte{m, m[:len(m)-1], m[:9], m[:4], nil, {0, 'a', 's', 'm', 2, 0, 0, 0},
		append(slices.Clip(m), 0, 2, 5, 'a'), append(slices.Clip(m), 0, 2, 1, 0xFF), append(slices.Clip(m), 0, 1, 0)} {
		sameWalk(t, b)
	}
	// The payloads are not read: at most each header's six bytes are.
	big := AppendCustom(slices.Clip(m), "big", make([]byte, 1<<20))
	r := &counting{r: bytes.NewReader(big)}
	secs, err := SectionsAt(r, int64(len(big)))
	require.NoError(t, err)
	require.Len(t, secs, 3)
	name, _, err := CustomNameAt(r, secs[2])
	require.NoError(t, err)
	require.Equal(t, "big", name)
	require.LessOrEqual(t, r.n, 8+3*maxHeader+5+len("big"))
}

// counting counts the bytes read through it.
type counting struct {
	r io.ReaderAt
	n int
}

func (c *counting) ReadAt(b []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(b, off)
	c.n += n
	return n, err
}

func FuzzSectionsAt(f *testing.F) {
	m := append([]byte{0, 'a', 's', 'm', 1, 0, 0, 0}, 1, 4, 1, 0x60, 0, 0)
	f.Add(AppendCustom(m, "name", []byte("xy")))
	f.Add([]byte{0, 'a', 's', 'm', 1, 0, 0, 0, 0, 0x80})
	f.Fuzz(sameWalk)
}
