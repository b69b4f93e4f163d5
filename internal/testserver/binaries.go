package testserver

import (
	"path/filepath"
	"syscall"
)

// The lookups below serve harnesses that run the servers themselves
// (chaos/ starts, kills and restarts its own PostgreSQL and Redis): the
// same binaries, the same apt-get fallback, the same user rule as the
// private servers of this package.

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
func FreePort() (int, error) { return freePort() }
