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
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

func TestMain(m *testing.M) {
	code := m.Run()
	wasmbuild.Cleanup()
	os.Exit(code)
}

// EnvSeed names a variable that sets the short run's seed.
const EnvSeed = "PROTEAN_CHAOS_SEED"

// shortKinds are the faults of the short run: one per target of a
// fault (a host, Redis, PostgreSQL, the network), so that make test
// sees each class of failure.
var shortKinds = []Kind{HostKill, RedisKill, PGFast, CutPG}

// TestShortChaos is `make chaos` in small, inside `make test`: the real
// binary as three hosts, a few faults, the same checks. It fails on any
// violation; it skips only when the binary cannot be built.
func TestShortChaos(t *testing.T) {
	root := wasmbuild.Root()
	bin := filepath.Join(t.TempDir(), "protean-host")
	build := exec.Command("go", "build", "-o", bin, "./cmd/protean-host")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Skipf("skipping the chaos run: the protean-host binary does not build: %v\n%s", err, out)
	}
	plugins := wasmbuild.Examples(t)
	variant := wasmbuild.Build(t, "./plugins/examples/client_orders", "version=1.0.1-chaos")
	seed := uint64(1)
	if s := os.Getenv(EnvSeed); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, EnvSeed)
		seed = n
	}
	t.Logf("seed %d (%s=%d to run it again)", seed, EnvSeed, seed)
	w := &lineLogger{t: t}
	// Settle: a healthy run converges within a few seconds of its last
	// fault on an idle machine; three minutes is a bound a machine at
	// load 20 does not reach, and it is only spent when the run fails.
	rep, err := Run(context.Background(), Options{Seed: seed, Steps: len(shortKinds), Kinds: shortKinds, Settle: 3 * time.Minute,
		Bin: bin, Plugins: plugins, Variant: variant, Root: root, Out: w})
	w.flush()
	require.NoError(t, err)
	require.False(t, rep.Failed(), "violations: %v %v", rep.Outcome.Violations(), rep.Errors)
	require.Positive(t, rep.Outcome.Accepted)
}

// lineLogger writes each line to the test's log.
type lineLogger struct {
	t   *testing.T
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for {
		line, err := l.buf.ReadString('\n')
		if err != nil {
			l.buf.WriteString(line)
			return len(p), nil
		}
		l.t.Log(strings.TrimRight(line, "\n"))
	}
}

func (l *lineLogger) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buf.Len() > 0 {
		l.t.Log(l.buf.String())
		l.buf.Reset()
	}
}

func TestPlanIsTheSeedsAndCoversEveryKind(t *testing.T) {
	t.Parallel()
	ttl := 3 * time.Second
	a := Plan(7, len(Kinds)+5, 3, ttl, Kinds)
	require.Equal(t, a, Plan(7, len(Kinds)+5, 3, ttl, Kinds), "the same seed plans the same schedule")
	require.NotEqual(t, a, Plan(8, len(Kinds)+5, 3, ttl, Kinds))
	seen := map[Kind]int{}
	for i, st := range a {
		if i < len(Kinds) {
			require.Len(t, st.Faults, 1, "step %d: every kind runs alone first", i)
			seen[st.Faults[0].Kind]++
			continue
		}
		require.Len(t, st.Faults, 2, "step %d is mixed", i)
		require.NotEqual(t, st.Faults[0].Kind.target(), st.Faults[1].Kind.target(), "step %d mixes two faults on one target", i)
	}
	for _, k := range Kinds {
		require.Equal(t, 1, seen[k], "kind %s alone", k)
	}
	for _, st := range a {
		for _, f := range st.Faults {
			switch f.Kind {
			case HostStop:
				require.Greater(t, f.Hold, ttl, "a stop outlasts the lease")
			case CutPG, CutRedis, StallPGUp, StallPGDown, StallRedisUp, StallRedisDown:
				require.GreaterOrEqual(t, f.Hold, time.Second)
				require.Less(t, f.Hold, 10*time.Second)
			}
		}
	}
	require.Len(t, Plan(7, 2, 3, ttl, Kinds), 2)
}

func TestParseKinds(t *testing.T) {
	t.Parallel()
	ks, err := ParseKinds("")
	require.NoError(t, err)
	require.Equal(t, Kinds, ks)
	ks, err = ParseKinds("host-kill, cut-pg")
	require.NoError(t, err)
	require.Equal(t, []Kind{HostKill, CutPG}, ks)
	_, err = ParseKinds("host-kil")
	require.ErrorContains(t, err, `unknown fault kind "host-kil"`)
}

func TestParseFsync(t *testing.T) {
	t.Parallel()
	for _, ok := range []Fsync{FsyncAlways, FsyncEverySec} {
		f, err := ParseFsync(string(ok))
		require.NoError(t, err)
		require.Equal(t, ok, f)
	}
	for _, bad := range []string{"", "no", "Always"} {
		_, err := ParseFsync(bad)
		require.ErrorContains(t, err, fmt.Sprintf("appendfsync %q: want \"always\" or \"everysec\"", bad))
	}
}

// The hosts' config is production.toml with the harness's settings: it
// loads (no unknown key) and says what the harness meant.
func TestWriteConfigOverProduction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "host.toml")
	require.NoError(t, WriteConfig(filepath.Join(wasmbuild.Root(), "configs", "production.toml"), path, HostConfig{
		DatabaseURL: "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable", RedisURL: "redis://127.0.0.1:2/0",
		Listen: "127.0.0.1:3", PluginsDir: "/p", CacheDir: "/c", LeaseTTL: 3 * time.Second,
		Settings: map[string]any{"plugins.document_cache_mb": int64(0), "outbox.messages_per_tick": int64(7)},
	}))
	t.Setenv(config.EnvDatabaseURL, "")
	t.Setenv(config.EnvRedisURL, "")
	c, err := config.Load(path)
	require.NoError(t, err)
	require.Equal(t, 3*time.Second, c.Server.Partitioning.LeaseTTL())
	require.Equal(t, 3*time.Second, c.Outbox.LockTimeout())
	require.Equal(t, "redis://127.0.0.1:2/0", c.OutboxBroker().URI)
	require.Equal(t, "127.0.0.1:3", c.HTTP.Listen)
	require.Equal(t, "/p", c.Plugins.Dir)
	require.False(t, c.Plugins.Watch)
	require.Zero(t, c.Plugins.DocumentCacheMB)
	require.Equal(t, 7, c.Outbox.MessagesPerTick)
	// The rest is production's.
	require.Equal(t, 3, c.Outbox.MaxRetries)
}

func TestParseSetting(t *testing.T) {
	k, v, err := ParseSetting("plugins.document_cache_mb=0")
	require.NoError(t, err)
	require.Equal(t, "plugins.document_cache_mb", k)
	require.Equal(t, int64(0), v)
	k, v, err = ParseSetting(`http.listen = "127.0.0.1:1"`)
	require.NoError(t, err)
	require.Equal(t, "http.listen", k)
	require.Equal(t, "127.0.0.1:1", v)
	for _, bad := range []string{"plugins.document_cache_mb", "=1", "plugins.=1", "a.b=not toml"} {
		_, _, err := ParseSetting(bad)
		require.Error(t, err, bad)
	}
}
