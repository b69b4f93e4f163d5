// Package atomicfile replaces a file whole: a reader sees the old file or
// the new one, never part of one, and so does a restart after a crash.
//
// WriteFile writes to a temporary file of the same directory (named
// .NAME-*.tmp, so a watcher of *.wasm files does not see it), syncs it,
// renames it over the file and syncs the directory. The deployer writes
// module files and their history so, and plugin embed-manifest rewrites a
// module in place. (The compiled-code cache's index and memos are written
// through a temporary file and a rename too, without the syncs: a cache
// that loses a write is only a cache, and a start writes hundreds of
// memos.)
package atomicfile

import (
	"os"
	"path/filepath"
)

// WriteFile replaces the file path with b, with permissions perm.
func WriteFile(path string, b []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+"-*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	fail := func(err error) error {
		_ = f.Close()
		_ = os.Remove(tmp)
		return err
	}
	if _, err := f.Write(b); err != nil {
		return fail(err)
	}
	if err := f.Chmod(perm); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return SyncDir(dir)
}

// SyncDir syncs the directory dir, so that a rename or a removal in it
// survives a crash.
func SyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
