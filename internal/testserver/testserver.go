// Package testserver gives tests real PostgreSQL and Redis servers.
//
// [Postgres] returns the URL of a fresh, empty database for the caller and
// drops it when the test ends; [Redis] returns a server URL and a key prefix
// of the caller's own, and deletes the prefix's keys when the test ends.
//
// When PROTEAN_TEST_DATABASE_URL (a postgres:// URL whose user may create
// databases) or PROTEAN_TEST_REDIS_URL is set, that server is used; this is
// how scripts/test-services.sh shares one server of each kind across a whole
// `make test` run. Otherwise the first call in a test binary starts a
// private server on a free loopback port in a temporary directory, and
// [Stop] stops it. A package that uses this one must therefore have
//
//	func TestMain(m *testing.M) { testserver.Main(m) }
//
// or, where the package adds its own checks (goleak), m.Run, then Stop,
// then os.Exit.
//
// (The private servers also die with the test binary's process, as a
// safety net, but only Stop removes their data directories.)
//
// Missing server binaries are installed with apt-get when the tests run as
// root; otherwise the test fails with the command to run.
package testserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/proteanhq/protean-host/internal/serverbin"
)

// Environment variables naming shared servers.
const (
	EnvDatabaseURL = "PROTEAN_TEST_DATABASE_URL"
	EnvRedisURL    = "PROTEAN_TEST_REDIS_URL"
)

// startTimeout bounds how long a private server may take to accept
// connections.
const startTimeout = 60 * time.Second

// server is a private server process this package started.
type server struct {
	cmd  *exec.Cmd
	dir  string // temporary directory, removed on stop
	url  string
	exit chan struct{} // closed when the process has exited
	err  error         // why the start failed
}

var (
	pgOnce    sync.Once
	pg        *server
	redisOnce sync.Once
	rds       *server
)

// Stop stops the private servers this test binary started, by their own
// process, and removes their directories. It is safe to call when none was
// started, and more than once.
func Stop() {
	// Make a later first call fail instead of starting a server nobody stops.
	pgOnce.Do(func() { pg = &server{err: errors.New("testserver: Stop was called")} })
	redisOnce.Do(func() { rds = &server{err: errors.New("testserver: Stop was called")} })
	for _, s := range []*server{pg, rds} {
		s.stop()
	}
}

func (s *server) stop() {
	if s == nil || s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.exit:
	default:
		// SIGINT is PostgreSQL's fast shutdown; Redis exits on it too.
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.exit:
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exit
		}
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
		s.dir = ""
	}
}

// Postgres returns a connection URL to a new, empty database, dropped when
// tb ends. It skips nothing: when no server can be had, tb fails.
func Postgres(tb testing.TB) string {
	tb.Helper()
	base, err := postgresBase()
	if err != nil {
		tb.Fatal(err)
	}
	u, err := url.Parse(base)
	if err != nil {
		tb.Fatalf("testserver: %s: %v", EnvDatabaseURL, err)
	}
	name := databaseName(tb.Name())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := adminExec(ctx, u, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("testserver: create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := adminExec(ctx, u, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			tb.Logf("testserver: drop database %s: %v", name, err)
		}
	})
	db := *u
	db.Path = "/" + name
	return db.String()
}

// PostgresAvailable reports whether Postgres can give a database, without
// failing: benchmarks use it to skip when no server can be had.
func PostgresAvailable() error {
	_, err := postgresBase()
	return err
}

// postgresBase returns the URL of the server's maintenance database.
func postgresBase() (string, error) {
	if v := os.Getenv(EnvDatabaseURL); v != "" {
		return v, nil
	}
	pgOnce.Do(func() { pg = startPostgres() })
	return pg.url, pg.err
}

// adminExec runs one statement on the server's maintenance database
// (whatever database the base URL names).
func adminExec(ctx context.Context, base *url.URL, sql string) error {
	conn, err := pgx.Connect(ctx, base.String())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

var unsafeName = regexp.MustCompile(`[^a-z0-9_]+`)

// databaseName makes a unique, valid database name from a test name.
func databaseName(test string) string {
	s := strings.Trim(unsafeName.ReplaceAllString(strings.ToLower(test), "_"), "_")
	if len(s) > 40 {
		s = s[len(s)-40:]
	}
	return "t_" + s + "_" + randomHex(6)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Redis returns a Redis URL and a key prefix that is the caller's alone;
// the prefix's keys are deleted when tb ends.
func Redis(tb testing.TB) (redisURL, prefix string) {
	tb.Helper()
	base, err := redisBase()
	if err != nil {
		tb.Fatal(err)
	}
	prefix = "t:" + databaseName(tb.Name()) + ":"
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := redisDeletePrefix(ctx, base, prefix); err != nil {
			tb.Logf("testserver: delete redis keys %s*: %v", prefix, err)
		}
	})
	return base, prefix
}

// RedisAvailable reports whether Redis can give a server, without failing.
func RedisAvailable() error {
	_, err := redisBase()
	return err
}

func redisBase() (string, error) {
	if v := os.Getenv(EnvRedisURL); v != "" {
		return v, nil
	}
	redisOnce.Do(func() { rds = startRedis() })
	return rds.url, rds.err
}

// hint adds to a missing binary's error how tests can use a running
// server instead.
func hint(err error) error {
	if errors.Is(err, serverbin.ErrNotFound) {
		return fmt.Errorf("testserver: %w (or set %s / %s to a running server)", err, EnvDatabaseURL, EnvRedisURL)
	}
	return err
}

// startPostgres initialises a cluster in a temporary directory and starts
// it on a free loopback port. When running as root it runs both as the
// postgres user, which PostgreSQL requires.
func startPostgres() *server {
	binDir, err := serverbin.PostgresBinDir()
	if err != nil {
		return &server{err: hint(err)}
	}
	cred, uid, gid, err := serverbin.PostgresCredential()
	if err != nil {
		return &server{err: err}
	}
	dir, err := os.MkdirTemp("", "protean-pg-")
	if err != nil {
		return &server{err: fmt.Errorf("testserver: %w", err)}
	}
	fail := func(err error) *server {
		_ = os.RemoveAll(dir)
		return &server{err: fmt.Errorf("testserver: postgres: %w", err)}
	}
	if cred != nil {
		if err := os.Chown(dir, uid, gid); err != nil {
			return fail(err)
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(binDir, "initdb"), "-D", data, "-A", "trust", "-U", "postgres",
		"-E", "UTF8", "--no-locale", "--no-sync", "--no-instructions")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %v\n%s", err, out))
	}
	var last error
	for range 3 { // a free port can be taken between probe and listen
		port, err := serverbin.FreePort()
		if err != nil {
			return fail(err)
		}
		cmd := exec.Command(filepath.Join(binDir, "postgres"), "-D", data,
			"-p", strconv.Itoa(port), "-k", dir,
			"-c", "listen_addresses=127.0.0.1",
			"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
			"-c", "max_connections=300", "-c", "shared_buffers=64MB")
		cmd.Dir = dir
		logPath := filepath.Join(dir, fmt.Sprintf("postgres-%d.log", port))
		s := &server{dir: dir, url: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)}
		if err := s.start(cmd, cred, logPath); err != nil {
			return fail(err)
		}
		if err := s.waitReady(func(ctx context.Context) error {
			conn, err := pgx.Connect(ctx, s.url)
			if err != nil {
				return err
			}
			return conn.Close(ctx)
		}, logPath); err != nil {
			last = err
			s.dir = "" // keep the directory for the next attempt
			s.stop()
			continue
		}
		return s
	}
	return fail(last)
}

// startRedis starts redis-server on a free loopback port, without
// persistence.
func startRedis() *server {
	bin, err := serverbin.RedisServer()
	if err != nil {
		return &server{err: hint(err)}
	}
	dir, err := os.MkdirTemp("", "protean-redis-")
	if err != nil {
		return &server{err: fmt.Errorf("testserver: %w", err)}
	}
	var last error
	for range 3 {
		port, err := serverbin.FreePort()
		if err != nil {
			_ = os.RemoveAll(dir)
			return &server{err: err}
		}
		cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no")
		cmd.Dir = dir
		logPath := filepath.Join(dir, fmt.Sprintf("redis-%d.log", port))
		s := &server{dir: dir, url: fmt.Sprintf("redis://127.0.0.1:%d/0", port)}
		if err := s.start(cmd, nil, logPath); err != nil {
			_ = os.RemoveAll(dir)
			return &server{err: fmt.Errorf("testserver: redis: %w", err)}
		}
		if err := s.waitReady(func(ctx context.Context) error {
			c, err := dialRedis(ctx, s.url)
			if err != nil {
				return err
			}
			defer c.close()
			_, err = c.do("PING")
			return err
		}, logPath); err != nil {
			last = err
			s.dir = ""
			s.stop()
			continue
		}
		return s
	}
	_ = os.RemoveAll(dir)
	return &server{err: fmt.Errorf("testserver: redis: %w", last)}
}

// start launches cmd with its output in logPath. The process gets SIGINT
// if this one dies first, so a forgotten Stop leaks no server.
func (s *server) start(cmd *exec.Cmd, cred *syscall.Credential, logPath string) error {
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	if cred != nil {
		_ = logf.Chown(int(cred.Uid), int(cred.Gid))
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGINT, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	s.cmd = cmd
	s.exit = make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(s.exit)
	}()
	return nil
}

// waitReady polls ping until it succeeds, the process exits or the start
// timeout passes.
func (s *server) waitReady(ping func(ctx context.Context) error, logPath string) error {
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := ping(ctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.exit:
			out, _ := os.ReadFile(logPath)
			return fmt.Errorf("server exited before accepting connections: %s", out)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(logPath)
			return fmt.Errorf("server not ready after %s: %v\n%s", startTimeout, err, out)
		}
	}
}
