package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"
)

// HostConfig is what a host's config file says beyond the base file
// (configs/production.toml): where its servers are (through its proxies)
// and the short lease TTL that lets faults resolve quickly.
type HostConfig struct {
	DatabaseURL string
	RedisURL    string
	Listen      string
	PluginsDir  string
	CacheDir    string
	LeaseTTL    time.Duration
	// Pprof turns on [http] pprof (net/http/pprof under /debug/pprof/,
	// block and mutex sampling) for a load run's profiles; false leaves
	// the base file's setting.
	Pprof bool
	// Settings are more settings, each a dotted key ("plugins.
	// document_cache_mb") and its value, set last: loadgen's -compare.
	Settings map[string]any
}

// ParseSetting reads "table.key=value", value in TOML ("0", "true",
// "\"text\""), into a dotted key and its value.
func ParseSetting(s string) (string, any, error) {
	key, value, ok := strings.Cut(s, "=")
	key = strings.TrimSpace(key)
	if !ok || key == "" || strings.HasPrefix(key, ".") || strings.HasSuffix(key, ".") {
		return "", nil, fmt.Errorf("setting %q: want table.key=value", s)
	}
	var v struct{ V any }
	if _, err := toml.Decode("V = "+value, &v); err != nil {
		return "", nil, fmt.Errorf("setting %q: the value is not TOML: %w", s, err)
	}
	return key, v.V, nil
}

// WriteConfig writes base (a TOML file, e.g. configs/production.toml)
// with c's settings over it to path. The relay's lock timeout follows
// the lease TTL, as the production file asks.
func WriteConfig(base, path string, c HostConfig) error {
	var m map[string]any
	if _, err := toml.DecodeFile(base, &m); err != nil {
		return fmt.Errorf("base config %s: %w", base, err)
	}
	set := func(table, key string, v any) {
		t := m
		for _, part := range strings.Split(table, ".") {
			sub, ok := t[part].(map[string]any)
			if !ok {
				sub = map[string]any{}
				t[part] = sub
			}
			t = sub
		}
		t[key] = v
	}
	ttl := c.LeaseTTL.Milliseconds()
	set("databases.default", "provider", "postgresql")
	set("databases.default", "database_uri", c.DatabaseURL)
	set("event_store", "provider", "message_db")
	set("event_store", "database_uri", c.DatabaseURL)
	set("brokers.default", "provider", "redis")
	set("brokers.default", "uri", c.RedisURL)
	set("server.partitioning", "lease_ttl_ms", ttl)
	set("outbox", "lock_timeout_ms", ttl)
	set("plugins", "dir", c.PluginsDir)
	set("plugins", "cache_dir", c.CacheDir)
	set("plugins", "watch", false)
	set("http", "listen", c.Listen)
	if c.Pprof {
		set("http", "pprof", true)
	}
	for k, v := range c.Settings {
		table, key := "", k
		if i := strings.LastIndex(k, "."); i >= 0 {
			table, key = k[:i], k[i+1:]
		}
		if table == "" {
			m[key] = v
			continue
		}
		set(table, key, v)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := toml.NewEncoder(f).Encode(m); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Host is one protean-host process (`run`), restarted as the faults need.
// Exits the harness did not cause are counted as crashes.
type Host struct {
	Index      int
	Addr       string // HTTP listen address
	bin        string
	pluginsDir string
	cfg        string
	log        string
	note       func(format string, args ...any)

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{}
	expected bool // the harness is ending this process
	crashes  int
	starts   int
	paused   bool
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

// Start runs the host and waits until /healthz answers 200. A host that
// exits before that (its servers unreachable at start, say) is started
// again, until serverBound passes.
func (h *Host) Start(ctx context.Context) error {
	var last string
	deadline := time.Now().Add(serverBound)
	for time.Now().Before(deadline) {
		done, err := h.spawn()
		if err != nil {
			return err
		}
		err = until(ctx, time.Until(deadline), fmt.Sprintf("host %d healthy", h.Index), func() (bool, string) {
			select {
			case <-done:
				return true, "exited"
			default:
			}
			code, _, err := h.get(ctx, "/healthz")
			return err == nil && code == 200, fmt.Sprintf("%d %v", code, err)
		})
		if err != nil {
			return fmt.Errorf("%w\n%s", err, h.Tail())
		}
		select {
		case <-done:
			last = h.Tail()
			h.note("host %d exited at start; starting it again", h.Index)
			hold(ctx, time.Second) // let whatever refused it (a server restarting) move on
			continue
		default:
			return nil
		}
	}
	return fmt.Errorf("%w: host %d did not start within %s:\n%s", ErrTimeout, h.Index, serverBound, last)
}

// Compiled waits until the host's /healthz reads "ok": every module it
// loaded without compiling (a warm start from its memos, a start from
// manifest sections) has its code compiled. Until then it reads
// "starting", and a measurement would count the compiles as the path's
// cost.
func (h *Host) Compiled(ctx context.Context) error {
	return until(ctx, serverBound, fmt.Sprintf("host %d compiled its modules", h.Index), func() (bool, string) {
		code, b, err := h.get(ctx, "/healthz")
		if err != nil || code != 200 {
			return false, fmt.Sprintf("%d %v", code, err)
		}
		var health struct {
			Status    string `json:"status"`
			Compiling int    `json:"compiling"`
		}
		if err := json.Unmarshal(b, &health); err != nil {
			return false, err.Error()
		}
		return health.Status == "ok", fmt.Sprintf("%s, %d compiling", health.Status, health.Compiling)
	})
}

func (h *Host) spawn() (chan struct{}, error) {
	logf, err := os.OpenFile(h.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.starts++
	fmt.Fprintf(logf, "=== chaos: start %d of host %d at %s\n", h.starts, h.Index, time.Now().UTC().Format(time.RFC3339Nano))
	h.mu.Unlock()
	cmd := exec.Command(h.bin, "run", "--config", h.cfg, "--shutdown-timeout", "5s")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = hostEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	done := make(chan struct{})
	h.mu.Lock()
	h.cmd, h.done, h.expected, h.paused = cmd, done, false, false
	h.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		h.mu.Lock()
		if !h.expected {
			h.crashes++
			h.note("host %d exited on its own: %v", h.Index, err)
		}
		h.mu.Unlock()
		close(done)
	}()
	return done, nil
}

// hostEnv is the harness's environment without the overrides that would
// point a host at other servers than its config's.
func hostEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PROTEAN_DATABASE_URL=") || strings.HasPrefix(kv, "PROTEAN_REDIS_URL=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// Config is the path of the host's config file (for the CLI's commands).
func (h *Host) Config() string { return h.cfg }

// Alive reports whether the process runs (a stopped one counts).
func (h *Host) Alive() bool {
	h.mu.Lock()
	done := h.done
	h.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Kill sends SIGKILL (no drain, no lease release) and waits for the end.
func (h *Host) Kill() error { return h.end(syscall.SIGKILL) }

// Stop sends SIGTERM (a graceful stop: drain, release the leases) and
// waits for the end; after exitBound it kills.
func (h *Host) Stop() error {
	err := h.end(syscall.SIGTERM)
	if err != nil {
		h.note("host %d: %v; killing it", h.Index, err)
		return h.end(syscall.SIGKILL)
	}
	return nil
}

func (h *Host) end(sig syscall.Signal) error {
	h.mu.Lock()
	cmd, done := h.cmd, h.done
	h.expected = true
	paused := h.paused
	h.mu.Unlock()
	if cmd == nil || !h.Alive() {
		return nil
	}
	_ = cmd.Process.Signal(sig)
	if paused && sig != syscall.SIGKILL {
		_ = cmd.Process.Signal(syscall.SIGCONT)
	}
	return waitDone(done, fmt.Sprintf("host %d to exit after %s", h.Index, sig))
}

// Signal sends sig to the running process.
func (h *Host) Signal(sig syscall.Signal) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cmd == nil {
		return fmt.Errorf("host %d not started", h.Index)
	}
	switch sig {
	case syscall.SIGSTOP:
		h.paused = true
	case syscall.SIGCONT:
		h.paused = false
	}
	return h.cmd.Process.Signal(sig)
}

// Crashes is how many times the process exited without the harness
// asking it to.
func (h *Host) Crashes() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.crashes
}

// Tail is the end of the host's log.
func (h *Host) Tail() string { return tail(h.log, 4000) }

// LogFile is the path of the host's log (its stdout and stderr).
func (h *Host) LogFile() string { return h.log }

func (h *Host) get(ctx context.Context, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+h.Addr+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// Owned is how many partitions the host owns now (its
// protean_partitions_owned gauges), or -1 when it does not answer.
func (h *Host) Owned(ctx context.Context) int {
	// Short: a host whose PostgreSQL is stalled answers /metrics late
	// (its outbox gauges read the table), and the fault should not wait.
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	code, b, err := h.get(ctx, "/metrics")
	if err != nil || code != 200 {
		return -1
	}
	n := 0
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "protean_partitions_owned{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			n += int(v)
		}
	}
	return n
}

// ModuleVersion is the version of the running module loaded from file,
// "" when the host does not answer or runs no such file.
func (h *Host) ModuleVersion(ctx context.Context, file string) string {
	code, b, err := h.get(ctx, "/v1/plugins")
	if err != nil || code != 200 {
		return ""
	}
	var out struct {
		Plugins []struct {
			File, Version, State string
		} `json:"plugins"`
	}
	if json.Unmarshal(b, &out) != nil {
		return ""
	}
	for _, p := range out.Plugins {
		if p.File == file && p.State == "running" {
			return p.Version
		}
	}
	return ""
}

// NewHost prepares host i's directory: its config and its own copy of
// the plugins (a reload changes one host's directory at a time).
func NewHost(i int, dir, bin, base, plugins string, c HostConfig, note func(string, ...any)) (*Host, error) {
	hdir := filepath.Join(dir, fmt.Sprintf("host-%d", i))
	c.PluginsDir = filepath.Join(hdir, "plugins")
	if err := os.MkdirAll(c.PluginsDir, 0o755); err != nil {
		return nil, err
	}
	files, err := filepath.Glob(filepath.Join(plugins, "*.wasm"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no *.wasm in %s (run make plugins)", plugins)
	}
	for _, f := range files {
		if err := copyFile(f, filepath.Join(c.PluginsDir, filepath.Base(f))); err != nil {
			return nil, err
		}
	}
	cfg := filepath.Join(hdir, "host.toml")
	if err := WriteConfig(base, cfg, c); err != nil {
		return nil, err
	}
	return &Host{Index: i, Addr: c.Listen, bin: bin, pluginsDir: c.PluginsDir, cfg: cfg, log: filepath.Join(hdir, "host.log"), note: note}, nil
}

// copyFile copies src to dst through a temporary name and a rename, so a
// reader of dst never sees half a file.
func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
