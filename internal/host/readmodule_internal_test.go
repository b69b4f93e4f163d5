package host

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// readModule reads a file as its fstat found it, and refuses one that
// grew past the limit between the fstat and the read.
func TestReadModuleSizes(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "m.wasm")
	content := bytes.Repeat([]byte("wasm"), 1000)
	require.NoError(t, os.WriteFile(path, content, 0o600))
	read := func(max int) ([]byte, error) {
		f, err := os.Open(path)
		require.NoError(t, err)
		defer f.Close()
		st, err := f.Stat()
		require.NoError(t, err)
		// The file grows (or shrinks) after its fstat, before the read.
		require.NoError(t, os.WriteFile(path, content, 0o600))
		return readModule(f, st, max)
	}

	b, err := read(1 << 20)
	require.NoError(t, err)
	require.Equal(t, content, b)

	short := content
	content = content[:1000]
	b, err = read(1 << 20)
	require.NoError(t, err)
	require.Equal(t, content, b, "a file that shrank is read as it is now")

	content = append(short, "more"...)
	require.NoError(t, os.WriteFile(path, short, 0o600))
	b, err = read(1 << 20)
	require.NoError(t, err)
	require.Equal(t, content, b, "a file that grew within the limit is read whole")

	require.NoError(t, os.WriteFile(path, short, 0o600))
	_, err = read(len(short) + 2)
	require.ErrorIs(t, err, ErrModuleTooLarge)
	require.ErrorContains(t, err, "grew past")
}
