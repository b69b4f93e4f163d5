package wasmbin

import (
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
