package host

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// Sentinel causes of a LoadError for a file the plugins directory may not
// hold, and of a directory or config file others may write.
var (
	// ErrNotRegular: a named pipe, device, socket or directory named
	// *.wasm. Opening a named pipe blocks until a writer comes, and a
	// device such as /dev/urandom never ends: neither is read.
	ErrNotRegular = errors.New("not a regular file")
	// ErrLinkOut: a symbolic link whose target leaves the plugins
	// directory. Always refused: whoever may write the directory could
	// otherwise have the host read any file it can (/etc/shadow).
	ErrLinkOut = errors.New("is a symbolic link out of the plugins directory")
	// ErrSymlink: a symbolic link within the directory, refused because
	// LoaderOptions.RefuseLinks is set ([plugins] follow_links = false).
	ErrSymlink = errors.New("is a symbolic link (follow_links is off)")
	// ErrWritable: a plugins directory, module file or config file that
	// users other than its owner and group may write (LoaderOptions.
	// RefuseWritable, [plugins] refuse_writable).
	ErrWritable = errors.New("writable by other users")
)

// openFlags open a module file for reading without blocking: a file
// swapped for a named pipe after its lstat is opened at once and refused
// by its fstat, instead of waiting for a writer forever.
const openFlags = os.O_RDONLY | syscall.O_NONBLOCK

// kind names what a file that is not a regular file is ("" for a regular
// file), for the refusal.
func kind(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return ""
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	}
	return "an irregular file"
}

// regular refuses a file that is not a regular file, saying what it is.
func regular(fi fs.FileInfo) error {
	if k := kind(fi.Mode()); k != "" {
		return fmt.Errorf("is %s, %w", k, ErrNotRegular)
	}
	return nil
}

// CheckWritable checks path (a symbolic link by its target) as the loader
// checks the plugins directory and its files: if users other than its
// owner and group may write it, it returns an error wrapping ErrWritable
// that names path and its mode when refuse is set, and logs a WARN to log
// otherwise. Only "other" counts: a group-writable directory is how a
// deploy group, or a Kubernetes volume with an fsGroup, shares one on
// purpose, and a warning on every such host would teach operators to
// ignore it.
func CheckWritable(log *slog.Logger, path string, refuse bool) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	return guardWritable(log, path, fi, refuse)
}

func guardWritable(log *slog.Logger, path string, fi fs.FileInfo, refuse bool) error {
	perm := fi.Mode().Perm()
	if perm&0o002 == 0 {
		return nil
	}
	if refuse {
		return fmt.Errorf("%s is %w (mode %04o): anyone on the machine can change what the host runs; chmod o-w it",
			path, ErrWritable, perm)
	}
	log.Warn("writable by other users: anyone on the machine can change what the host runs (chmod o-w it; [plugins] refuse_writable = true refuses it)",
		"path", path, "mode", fmt.Sprintf("%04o", perm))
	return nil
}

// openFile opens a module file the caller named (LoadFile): its links are
// followed, as any command follows the path it is given, but only a
// regular file is read.
func openFile(path string) (*os.File, fs.FileInfo, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, nil, err
	}
	if err := regular(fi); err != nil { // a socket cannot be opened at all
		return nil, nil, err
	}
	f, err := os.OpenFile(path, openFlags, 0)
	if err != nil {
		return nil, nil, err
	}
	return checkOpened(f)
}

// checkOpened fstats an opened file and keeps it only if it is a regular
// file: the file read is the file checked, whatever was swapped in since.
func checkOpened(f *os.File) (*os.File, fs.FileInfo, error) {
	st, err := f.Stat()
	if err == nil {
		err = regular(st)
	}
	if err != nil {
		_ = f.Close()
		return nil, nil, err
	}
	return f, st, nil
}

// pluginDir is a plugins directory opened for one load: its files are
// opened beneath root, so a link cannot lead out of it, whatever it is
// changed to between the check and the open.
type pluginDir struct {
	path string
	root *os.Root
	// real is path with its links resolved, to tell a link out of the
	// directory from one within it.
	real string
}

func openPluginDir(path string) (*pluginDir, error) {
	root, err := os.OpenRoot(path)
	if err != nil {
		return nil, err
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		_ = root.Close()
		return nil, err
	}
	return &pluginDir{path: path, root: root, real: real}, nil
}

func (d *pluginDir) Close() error { return d.root.Close() }

// inside reports whether the link name resolves within the directory.
func (d *pluginDir) inside(name string) (bool, error) {
	target, err := filepath.EvalSymlinks(filepath.Join(d.path, name))
	if err != nil {
		return false, err
	}
	rel, err := filepath.Rel(d.real, target)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)), nil
}

// open opens the module file name of the directory. The lstat names a
// refusal at once (a link out, a named pipe, a socket) without opening the
// file; the open is what holds against a file changed since: non-blocking,
// beneath the root (or with O_NOFOLLOW when links are refused), and the
// fstat of the opened file decides.
func (l *Loader) open(d *pluginDir, name string) (*os.File, fs.FileInfo, error) {
	fi, err := d.root.Lstat(name)
	if err != nil {
		return nil, nil, err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if l.refuseLinks {
			return nil, nil, ErrSymlink
		}
		in, err := d.inside(name)
		if err != nil {
			return nil, nil, err
		}
		if !in {
			return nil, nil, ErrLinkOut
		}
		if fi, err = d.root.Stat(name); err != nil {
			return nil, nil, err
		}
	}
	if err := regular(fi); err != nil {
		return nil, nil, err
	}
	var f *os.File
	if l.refuseLinks {
		f, err = os.OpenFile(filepath.Join(d.path, name), openFlags|syscall.O_NOFOLLOW, 0)
	} else {
		f, err = d.root.OpenFile(name, openFlags, 0)
	}
	if err != nil {
		return nil, nil, err
	}
	f, st, err := checkOpened(f)
	if err != nil {
		return nil, nil, err
	}
	if err := guardWritable(l.log, filepath.Join(d.path, name), st, l.refuseWritable); err != nil {
		_ = f.Close()
		return nil, nil, err
	}
	return f, st, nil
}

// readModule reads an opened module file of at most max bytes: its size
// is checked on its fstat before a byte is read, and the read stops one
// byte past max, so a file that grows while it is read is refused too.
func readModule(f *os.File, st fs.FileInfo, max int) ([]byte, error) {
	if st.Size() > int64(max) {
		return nil, fmt.Errorf("%w: %d bytes (limit %d)", ErrModuleTooLarge, st.Size(), max)
	}
	// One buffer of the file's size, filled, then a read of one byte more
	// that must find the end: a bytes.Buffer doubled (and cleared) a
	// buffer of the file's size at its end, a copy of every module.
	b := make([]byte, st.Size())
	n, err := io.ReadFull(f, b)
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF): // shrank while read
		return b[:n], nil
	case err != nil:
		return nil, err
	}
	rest, err := io.ReadAll(io.LimitReader(f, int64(max-n)+1))
	if err != nil {
		return nil, err
	}
	if len(rest) == 0 {
		return b, nil
	}
	if n+len(rest) > max {
		return nil, fmt.Errorf("%w: grew past %d bytes while read (limit %d)", ErrModuleTooLarge, max, max)
	}
	return append(b, rest...), nil
}

// hashModule is readModule that keeps nothing of the file but its
// SHA-256 and its size: it reads through a buffer it reuses, so that a
// start which serves from manifest sections and memos touches no fresh
// memory per module (reading a 4 MB module into a buffer of its own costs
// more in page faults than the read and the hash together).
func hashModule(f *os.File, st fs.FileInfo, max int) (sum [sha256.Size]byte, size int64, err error) {
	if st.Size() > int64(max) {
		return sum, 0, fmt.Errorf("%w: %d bytes (limit %d)", ErrModuleTooLarge, st.Size(), max)
	}
	buf := hashBuffers.Get().(*[]byte)
	defer hashBuffers.Put(buf)
	h := sha256.New()
	if size, err = io.CopyBuffer(h, io.LimitReader(f, int64(max)+1), *buf); err != nil {
		return sum, 0, err
	}
	if size > int64(max) {
		return sum, 0, fmt.Errorf("%w: grew past %d bytes while read (limit %d)", ErrModuleTooLarge, max, max)
	}
	h.Sum(sum[:0])
	return sum, size, nil
}

// hashBuffers are hashModule's read buffers.
var hashBuffers = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// checkDir is CheckWritable for the plugins directory itself.
func (l *Loader) checkDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("plugins directory %s: %w", dir, err)
	}
	if err := guardWritable(l.log, dir, fi, l.refuseWritable); err != nil {
		return fmt.Errorf("plugins directory %w", err)
	}
	return nil
}
