// Package serverbin finds the PostgreSQL and Redis server binaries that
// the test servers (internal/testserver) and the harnesses (chaos,
// loadgen) start themselves, installing them with apt-get when running as
// root, and the user PostgreSQL must run as. It links no testing code, so
// the harness binaries that ship do not either.
package serverbin

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// ErrNotFound marks a server binary that is missing and that this process
// may not install (it does not run as root).
var ErrNotFound = errors.New("server binary not found")

// installMu serialises installs: apt-get takes a lock of its own, but two
// installs of one package in one process need not both run.
var installMu sync.Mutex

// PostgresBinDir returns the directory holding initdb, pg_ctl and
// postgres (Debian keeps them off PATH), installing PostgreSQL when
// running as root.
func PostgresBinDir() (string, error) {
	bin, err := findBinary("initdb", postgresBinDirs(), "postgresql")
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(bin); err == nil {
		bin = real // the other binaries lie beside the real initdb
	}
	return filepath.Dir(bin), nil
}

// RedisServer returns the path of redis-server, installing it when
// running as root.
func RedisServer() (string, error) {
	return findBinary("redis-server", nil, "redis-server")
}

// PostgresCredential returns the credential to run PostgreSQL's binaries
// with: the postgres user's when running as root (PostgreSQL refuses
// root), nil otherwise; uid and gid own the server's directories.
func PostgresCredential() (cred *syscall.Credential, uid, gid int, err error) {
	return postgresUser()
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("serverbin: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// postgresBinDirs are where Debian and Ubuntu packages put the server
// binaries, newest first; they are not on PATH.
func postgresBinDirs() []string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i, j := 0, len(dirs)-1; i < j; i, j = i+1, j-1 {
		dirs[i], dirs[j] = dirs[j], dirs[i]
	}
	return dirs
}

// findBinary looks name up on PATH and in extra; when it is missing it
// installs pkg with apt-get if running as root, or explains how to.
func findBinary(name string, extra []string, pkg string) (string, error) {
	look := func() (string, bool) {
		if p, err := exec.LookPath(name); err == nil {
			return p, true
		}
		for _, d := range extra {
			p := filepath.Join(d, name)
			if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
				return p, true
			}
		}
		return "", false
	}
	if p, ok := look(); ok {
		return p, nil
	}
	install := "apt-get update && apt-get install -y " + pkg
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("serverbin: %s not found: install it with `sudo sh -c '%s'`: %w", name, install, ErrNotFound)
	}
	installMu.Lock()
	defer installMu.Unlock()
	if p, ok := look(); ok {
		return p, nil
	}
	for _, args := range [][]string{
		{"-o", "DPkg::Lock::Timeout=300", "update"},
		{"-o", "DPkg::Lock::Timeout=300", "install", "-y", "--no-install-recommends", pkg},
	} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("serverbin: %s not found, and `apt-get %s` failed: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	// The package may have started a system server of its own; it is not
	// ours, and tests do not use it.
	extra = append(extra, postgresBinDirs()...)
	if p, ok := look(); ok {
		return p, nil
	}
	return "", fmt.Errorf("serverbin: %s still not found after installing %s", name, pkg)
}

// postgresUser returns the credential to run PostgreSQL with: the postgres
// user's when running as root (PostgreSQL refuses root), nil otherwise.
func postgresUser() (cred *syscall.Credential, uid, gid int, err error) {
	if os.Geteuid() != 0 {
		return nil, 0, 0, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, 0, 0, fmt.Errorf("serverbin: running as root, PostgreSQL needs a non-root user: %w (create one with `useradd --system postgres`)", err)
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, uid, gid, nil
}
