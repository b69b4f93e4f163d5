package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/proteanhq/protean-host/internal/serverbin"
)

// Postgres is a private PostgreSQL 15 cluster run with pg_ctl, so that a
// fault can restart it the way an operator does (pg_ctl restart -m fast
// or -m immediate). As root, every pg_ctl runs as the postgres user.
//
// synchronous_commit stays on: an immediate shutdown is a crash, and a
// committed transaction must survive it. fsync is off: the operating
// system does not crash here, only the server's processes.
type Postgres struct {
	binDir string
	dir    string // owned by the server's user
	data   string
	log    string
	port   int
	cred   *syscall.Credential
	opts   string // the server's options (pg_ctl -o)
}

// StartPostgres initialises a cluster in a new directory under parent and
// starts it on a free loopback port; settings (name=value) are more of
// the server's settings, each given as -c.
func StartPostgres(ctx context.Context, parent string, settings ...string) (*Postgres, error) {
	binDir, err := serverbin.PostgresBinDir()
	if err != nil {
		return nil, err
	}
	cred, uid, gid, err := serverbin.PostgresCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(parent, "postgres-")
	if err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
	}
	port, err := serverbin.FreePort()
	if err != nil {
		return nil, err
	}
	p := &Postgres{binDir: binDir, dir: dir, data: filepath.Join(dir, "data"), log: filepath.Join(dir, "postgres.log"), port: port, cred: cred}
	if out, err := p.run(ctx, "initdb", "-D", p.data, "-A", "trust", "-U", "postgres", "-E", "UTF8",
		"--no-locale", "--no-sync", "--no-instructions"); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	args := []string{"-p", strconv.Itoa(port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200", "-c", "shared_buffers=64MB"}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	opts := strings.Join(args, " ")
	// pg_ctl remembers the options in postmaster.opts; restart reuses
	// them, a start after a stop is given them again (Down).
	p.opts = opts
	if out, err := p.pgctl(ctx, "-l", p.log, "-o", opts, "start"); err != nil {
		return nil, fmt.Errorf("pg_ctl start: %w\n%s\n%s", err, out, p.Tail())
	}
	return p, p.waitReady(ctx)
}

// Addr is the server's host:port.
func (p *Postgres) Addr() string { return fmt.Sprintf("127.0.0.1:%d", p.port) }

// URL is a connection URL to database postgres at addr (the server's own
// address, or a proxy's in front of it).
func URL(addr string) string {
	return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", addr)
}

// Restart runs pg_ctl restart -m mode (fast: clients are disconnected,
// transactions rolled back, a checkpoint; immediate: every process quits
// at once, crash recovery at start) and waits until it accepts
// connections again. The server logs to the same file after it (pg_ctl
// restart without -l would send its log to pg_ctl's output, lost).
func (p *Postgres) Restart(ctx context.Context, mode string) error {
	if out, err := p.pgctl(ctx, "-l", p.log, "-m", mode, "restart"); err != nil {
		return fmt.Errorf("pg_ctl restart -m %s: %w\n%s\n%s", mode, err, out, p.Tail())
	}
	return p.waitReady(ctx)
}

// Down stops the server (pg_ctl stop -m fast: clients are disconnected,
// transactions rolled back) for d, then starts it and waits until it
// accepts connections again.
func (p *Postgres) Down(ctx context.Context, d time.Duration) error {
	if out, err := p.pgctl(ctx, "-m", "fast", "stop"); err != nil {
		return fmt.Errorf("pg_ctl stop -m fast: %w\n%s\n%s", err, out, p.Tail())
	}
	hold(ctx, d)
	if out, err := p.pgctl(ctx, "-l", p.log, "-o", p.opts, "start"); err != nil {
		return fmt.Errorf("pg_ctl start: %w\n%s\n%s", err, out, p.Tail())
	}
	return p.waitReady(ctx)
}

// Stop stops the server (fast shutdown), or kills its postmaster when
// that fails, and removes its data directory unless keep. Safe to call
// more than once.
func (p *Postgres) Stop(keep bool) {
	if p == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := os.Stat(filepath.Join(p.data, "postmaster.pid")); err == nil {
		if _, err := p.pgctl(ctx, "-m", "fast", "stop"); err != nil {
			if pid := p.pid(); pid > 0 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	if !keep {
		_ = os.RemoveAll(p.data)
	}
}

// pid is the postmaster's pid from its pid file, 0 if none.
func (p *Postgres) pid() int {
	b, err := os.ReadFile(filepath.Join(p.data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return n
}

// Tail is the end of the server's log.
func (p *Postgres) Tail() string { return tail(p.log, 3000) }

// Log is the path of the server's log.
func (p *Postgres) Log() string { return p.log }

func (p *Postgres) pgctl(ctx context.Context, args ...string) ([]byte, error) {
	return p.run(ctx, "pg_ctl", append([]string{"-D", p.data, "-w", "-t", "120"}, args...)...)
}

func (p *Postgres) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(p.binDir, name), args...)
	cmd.Dir = p.dir
	// pg_ctl start leaves the postmaster running with the command's
	// output inherited: capture into a buffer would keep the pipe open
	// for as long as the server lives, so the output goes to a file.
	out, err := os.CreateTemp(p.dir, name+"-*.out")
	if err != nil {
		return nil, err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Setpgid: true}
	err = cmd.Run()
	b, _ := os.ReadFile(out.Name())
	return bytes.TrimSpace(b), err
}

// waitReady waits until a connection succeeds, for at most serverBound.
func (p *Postgres) waitReady(ctx context.Context) error {
	return until(ctx, serverBound, "PostgreSQL accepts connections", func() (bool, string) {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		c, err := pgx.Connect(cctx, URL(p.Addr()))
		if err != nil {
			return false, err.Error()
		}
		_ = c.Close(cctx)
		return true, ""
	})
}
