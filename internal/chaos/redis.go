package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/proteanhq/protean-host/internal/serverbin"
)

// Redis is a private redis-server with the append-only file on, fsynced
// on every write (appendfsync always) unless started with another
// [Fsync], so that a kill -9 or a SHUTDOWN NOSAVE loses nothing
// acknowledged; only [Redis.Wipe] does. It keeps its port across
// restarts.
type Redis struct {
	bin   string
	dir   string
	data  string
	log   string
	port  int
	fsync Fsync

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Fsync is a Redis append-only file's fsync policy (appendfsync).
type Fsync string

const (
	// FsyncAlways fsyncs every write before its answer: nothing
	// acknowledged is lost, even to a crash of the machine, and every
	// write waits for the disk.
	FsyncAlways Fsync = "always"
	// FsyncEverySec writes every write to the file before its answer and
	// fsyncs once a second in the background: a kill -9 of the server
	// loses nothing acknowledged (the kernel has it), a crash of the
	// machine loses up to about two seconds.
	FsyncEverySec Fsync = "everysec"
)

// ParseFsync reads an appendfsync policy: always or everysec.
func ParseFsync(s string) (Fsync, error) {
	switch f := Fsync(s); f {
	case FsyncAlways, FsyncEverySec:
		return f, nil
	}
	return "", fmt.Errorf("appendfsync %q: want %q or %q", s, FsyncAlways, FsyncEverySec)
}

// StartRedis starts redis-server in a new directory under parent on a
// free loopback port, fsyncing every write (FsyncAlways).
func StartRedis(ctx context.Context, parent string) (*Redis, error) {
	return StartRedisFsync(ctx, parent, FsyncAlways)
}

// StartRedisFsync is StartRedis with the append-only file's fsync policy.
func StartRedisFsync(ctx context.Context, parent string, fsync Fsync) (*Redis, error) {
	bin, err := serverbin.RedisServer()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(parent, "redis-")
	if err != nil {
		return nil, err
	}
	port, err := serverbin.FreePort()
	if err != nil {
		return nil, err
	}
	r := &Redis{bin: bin, dir: dir, data: filepath.Join(dir, "data"), log: filepath.Join(dir, "redis.log"), port: port, fsync: fsync}
	return r, r.Start(ctx)
}

// Addr is the server's host:port.
func (r *Redis) Addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }

// Start starts the server on its data directory (after a stop) and waits
// until it answers PING (it answers LOADING while it replays its AOF).
func (r *Redis) Start(ctx context.Context) error {
	if err := os.MkdirAll(r.data, 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(r.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--dir", r.data, "--appendonly", "yes", "--appendfsync", string(r.fsync), "--save", "",
		"--daemonize", "no")
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so a ^C to the harness reaches the harness
	// only (which stops the server itself); SIGKILL if the harness dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	r.mu.Lock()
	r.cmd, r.done = cmd, done
	r.mu.Unlock()
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	defer c.Close()
	return until(ctx, serverBound, "Redis answers PING", func() (bool, string) {
		select {
		case <-done:
			return false, "redis-server exited: " + tail(r.log, 2000)
		default:
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if err := c.Ping(pctx).Err(); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// Kill sends SIGKILL and waits for the process to end.
func (r *Redis) Kill() error {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Kill()
	return waitDone(done, "redis-server to die after SIGKILL")
}

// ShutdownNoSave sends SHUTDOWN NOSAVE (no RDB snapshot; the AOF, fsynced
// on every write, stays) and waits for the process to end.
func (r *Redis) ShutdownNoSave(ctx context.Context) error {
	r.mu.Lock()
	done := r.done
	r.mu.Unlock()
	c := redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1})
	defer c.Close()
	// The server closes the connection instead of answering.
	_ = c.Do(ctx, "SHUTDOWN", "NOSAVE").Err()
	return waitDone(done, "redis-server to exit after SHUTDOWN NOSAVE")
}

// Wipe deletes the data directory (AOF and RDB) of a stopped server: the
// next Start is empty.
func (r *Redis) Wipe() error { return os.RemoveAll(r.data) }

// Stop ends the server if it runs, and removes its data unless keep. Safe
// to call more than once.
func (r *Redis) Stop(keep bool) {
	if r == nil {
		return
	}
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	if cmd != nil {
		select {
		case <-done:
		default:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		}
	}
	if !keep {
		_ = os.RemoveAll(r.data)
	}
}

// Tail is the end of the server's log.
func (r *Redis) Tail() string { return tail(r.log, 3000) }
