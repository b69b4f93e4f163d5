package atomicfile_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/atomicfile"
)

// WriteFile replaces the file with the bytes and the mode given and
// leaves no temporary file behind; a directory that does not exist is an
// error and writes nothing.
func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "m.wasm")
	require.NoError(t, os.WriteFile(p, []byte("old"), 0o600))
	require.NoError(t, atomicfile.WriteFile(p, []byte("new"), 0o640))
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, "new", string(b))
	st, err := os.Stat(p)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o640), st.Mode().Perm())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file left")

	require.Error(t, atomicfile.WriteFile(filepath.Join(dir, "none", "m.wasm"), []byte("x"), 0o644))
}
