package config_test

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/config"
)

// clearEnv unsets the overrides for one test so the developer's or CI's
// environment cannot change what it sees. (t.Setenv rules out t.Parallel.)
func clearEnv(t *testing.T) {
	t.Setenv(config.EnvDatabaseURL, "")
	t.Setenv(config.EnvRedisURL, "")
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "host.toml")
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}

// lines splits a joined error into its messages.
func lines(err error) []string {
	if err == nil {
		return nil
	}
	return strings.Split(err.Error(), "\n")
}

func ptr[T any](v T) *T { return &v }

func TestDefault(t *testing.T) {
	t.Parallel()
	c := config.Default()
	require.NoError(t, c.Validate())

	require.Equal(t, config.Database{Provider: "memory"}, c.Databases["default"])
	require.Equal(t, config.EventStore{Provider: "memory"}, c.EventStore)
	require.Equal(t, config.Broker{Provider: "inline"}, c.OutboxBroker())
	require.Equal(t, config.Outbox{
		Broker: "default", MessagesPerTick: 50, TickIntervalMS: 10, MaxRetries: 3,
		BaseRetryDelayMS: 1000, MaxRetryDelayMS: 60000, BackoffJitter: 0.1, LockTimeoutMS: 15000, RelayLeaseMS: 5000,
		PublishedRetentionHours: 168, AbandonedRetentionHours: 720, RestartRepublishSeconds: 60,
	}, c.Outbox)

	p := c.Server.Partitioning
	require.Equal(t, 15*time.Second, p.LeaseTTL())
	require.Nil(t, p.HeartbeatIntervalSeconds)
	require.Equal(t, 3*time.Second, p.HeartbeatInterval())
	require.Equal(t, 10*time.Second, p.PollInterval())
	require.Equal(t, time.Hour, p.ReapIdle())
	require.Equal(t, 1000, p.WarnLivePartitions)

	require.Equal(t, config.PriorityLanes{BackfillSuffix: "backfill"}, c.Server.PriorityLanes)
	require.Equal(t, 3, c.Server.StreamSubscription.MaxRetries)
	require.Equal(t, time.Second, c.Server.StreamSubscription.RetryDelay())

	require.Equal(t, config.Plugins{
		Dir: "build/plugins", CacheDir: ".cache/wasm", CacheMaxMB: 256, FollowLinks: true, DocumentCacheMB: 16,
		Limits: config.Limits{MemoryMB: 64, TimeoutMS: 5000, MaxOutputBytes: 16 << 20, ManifestTimeoutMS: 2000, Interruptible: true,
			MaxTableElements: 100000, MaxModuleBytes: 32 << 20, CompileTimeoutMS: 10000, RecycleAboveMB: 32, InstanceIdleMS: 60000, LogLinesPerSecond: 10, LogBurst: 100, MaxCascadeDepth: 16, MaxFollowUps: 256,
			ShapeLimits: config.ShapeLimits{MaxFunctions: 100_000, MaxFunctionBytes: 1 << 20, MaxFunctionLocals: 50_000, MaxModuleLocals: 1_000_000,
				MaxNestingDepth: 8192, MaxNestingCost: 100_000_000},
			CallLimits: config.CallLimits{MaxHostCalls: 10_000, MaxHostBytes: 64 << 20, MaxReadBytes: 1 << 20}},
	}, c.Plugins)
	require.Empty(t, c.Tenants)
	require.Equal(t, "127.0.0.1:8080", c.HTTP.Listen)

	require.Equal(t, 10*time.Millisecond, c.Outbox.TickInterval())
	require.Equal(t, time.Second, c.Outbox.BaseRetryDelay())
	require.Equal(t, time.Minute, c.Outbox.MaxRetryDelay())
	require.Equal(t, 15*time.Second, c.Outbox.LockTimeout())
	require.Equal(t, 7*24*time.Hour, c.Outbox.PublishedRetention())
	require.Equal(t, 30*24*time.Hour, c.Outbox.AbandonedRetention())
	require.Equal(t, 5*time.Second, c.Plugins.Limits.Timeout())
	require.Equal(t, 2*time.Second, c.Plugins.Limits.ManifestTimeout())
}

func TestDefaultIsFresh(t *testing.T) {
	t.Parallel()
	a := config.Default()
	a.Brokers["default"] = config.Broker{Provider: "redis"}
	a.Tenants["x"] = config.Tenant{}
	b := config.Default()
	require.Equal(t, "inline", b.Brokers["default"].Provider)
	require.Empty(t, b.Tenants)
}

func TestLoadNoFile(t *testing.T) {
	clearEnv(t)
	c, err := config.Load("")
	require.NoError(t, err)
	require.Equal(t, config.Default(), c)
}

func TestLoadPartialKeepsDefaults(t *testing.T) {
	clearEnv(t)
	path := writeFile(t, `
[server.partitioning]
lease_ttl_ms = 3000

[brokers.events]
provider = "redis"
uri = "redis://127.0.0.1:6379/1"

[tenants.acme]
modules = ["orders"]
timeout_ms = 100
`)
	c, err := config.Load(path)
	require.NoError(t, err)

	want := config.Default()
	want.Server.Partitioning.LeaseTTLMS = 3000
	want.Brokers["events"] = config.Broker{Provider: "redis", URI: "redis://127.0.0.1:6379/1"}
	want.Tenants["acme"] = config.Tenant{Modules: []string{"orders"}, TimeoutMS: ptr(100)}
	require.Equal(t, want, c)
	// The heartbeat follows the TTL when unset.
	require.Equal(t, 600*time.Millisecond, c.Server.Partitioning.HeartbeatInterval())
}

func TestLoadExplicitHeartbeat(t *testing.T) {
	clearEnv(t)
	c, err := config.Load(writeFile(t, `
[server.partitioning]
lease_ttl_ms = 3000
heartbeat_interval_seconds = 0.3
poll_interval_seconds = 1   # an integer where a float is expected is fine
reap_idle_ms = 0
`))
	require.NoError(t, err)
	require.Equal(t, 300*time.Millisecond, c.Server.Partitioning.HeartbeatInterval())
	require.Equal(t, time.Second, c.Server.Partitioning.PollInterval())
	require.Zero(t, c.Server.Partitioning.ReapIdle())
}

func TestLoadUnknownKeys(t *testing.T) {
	clearEnv(t)
	path := writeFile(t, `
[server.partitioning]
lease_ttl = 3000

[outbox]
brokr = "default"

[nosuch]
a = 1
b = 2

[tenants.acme]
modulez = ["orders"]

[brokers.default]
provider = "inline"
url = "redis://x"
`)
	_, err := config.Load(path)
	require.Equal(t, []string{
		path + ": server.partitioning.lease_ttl is not a known key",
		path + ": outbox.brokr is not a known key",
		path + ": nosuch is not a known key",
		path + ": tenants.acme.modulez is not a known key",
		path + ": brokers.default.url is not a known key",
	}, lines(err))
	var fe *config.FieldError
	require.ErrorAs(t, err, &fe)
}

func TestLoadJoinsUnknownKeysAndInvalidValues(t *testing.T) {
	clearEnv(t)
	path := writeFile(t, `
[server.partitioning]
lease_ttl_ms = 0
lease_tt = 1

[http]
listen = "nowhere"
`)
	_, err := config.Load(path)
	require.Equal(t, []string{
		path + ": server.partitioning.lease_tt is not a known key",
		path + ": server.partitioning.lease_ttl_ms must be > 0 (got 0)",
		path + ": http.listen must be host:port, e.g. 127.0.0.1:8080 (got \"nowhere\")",
	}, lines(err))
}

func TestLoadReplacesNamedTables(t *testing.T) {
	clearEnv(t)
	// [brokers.default] replaces the whole default broker, so provider must be stated.
	path := writeFile(t, `
[brokers.default]
uri = "redis://127.0.0.1:6379/0"

[databases.default]
database_uri = "postgres://u:secret@db/x"
`)
	_, err := config.Load(path)
	require.Equal(t, []string{
		path + ": databases.default.provider is required (memory | postgresql)",
		path + ": brokers.default.provider is required (inline | redis)",
	}, lines(err))
	require.NotContains(t, err.Error(), "secret")
}

func TestLoadUnreadable(t *testing.T) {
	clearEnv(t)
	tests := []struct {
		name, body, want string
	}{
		{"syntax", "[server\nlease = 1", "toml: line"},
		{"type", "[server.partitioning]\nlease_ttl_ms = \"15s\"", "lease_ttl_ms"},
		{"duplicate", "[http]\nlisten = \"a:1\"\nlisten = \"b:2\"", "listen"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeFile(t, tt.body)
			_, err := config.Load(path)
			require.ErrorContains(t, err, "config "+path+": ")
			require.ErrorContains(t, err, tt.want)
		})
	}
	_, err := config.Load(filepath.Join(t.TempDir(), "missing.toml"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

const redisFixture = `
[databases.default]
provider = "postgresql"
database_uri = "postgres://protean:protean@127.0.0.1:5432/protean?sslmode=disable"

[event_store]
provider = "message_db"
database_uri = "postgres://protean:protean@127.0.0.1:5432/protean?sslmode=disable"

[brokers.default]
provider = "redis"
uri = "redis://127.0.0.1:6379/0"
`

func TestLoadEnvOverrides(t *testing.T) {
	t.Setenv(config.EnvDatabaseURL, "postgres://env@db:5432/env")
	t.Setenv(config.EnvRedisURL, "redis://env:6379/2")
	c, err := config.Load(writeFile(t, redisFixture))
	require.NoError(t, err)
	require.Equal(t, "postgres://env@db:5432/env", c.Databases["default"].DatabaseURI)
	require.Equal(t, "postgres://env@db:5432/env", c.EventStore.DatabaseURI)
	require.Equal(t, config.Broker{Provider: "redis", URI: "redis://env:6379/2"}, c.OutboxBroker())
}

func TestLoadEnvSatisfiesRequiredURIs(t *testing.T) {
	t.Setenv(config.EnvDatabaseURL, "postgres://env@db/env")
	t.Setenv(config.EnvRedisURL, "redis://env:6379/0")
	c, err := config.Load(writeFile(t, `
[databases.default]
provider = "postgresql"

[event_store]
provider = "message_db"

[brokers.default]
provider = "redis"
`))
	require.NoError(t, err)
	require.Equal(t, "postgres://env@db/env", c.EventStore.DatabaseURI)
	require.Equal(t, "redis://env:6379/0", c.Brokers["default"].URI)
}

func TestLoadEmptyEnvIsUnset(t *testing.T) {
	clearEnv(t)
	c, err := config.Load(writeFile(t, redisFixture))
	require.NoError(t, err)
	require.Equal(t, "postgres://protean:protean@127.0.0.1:5432/protean?sslmode=disable", c.EventStore.DatabaseURI)
	require.Equal(t, "redis://127.0.0.1:6379/0", c.Brokers["default"].URI)
}

func TestShippedConfigs(t *testing.T) {
	clearEnv(t)

	c, err := config.Load("../../configs/domain.toml")
	require.NoError(t, err)
	require.Equal(t, config.Default(), c, "domain.toml states the defaults it relies on")

	p, err := config.Load("../../configs/production.toml")
	require.NoError(t, err)
	const uri = "postgres://protean:protean@127.0.0.1:5432/protean?sslmode=disable"
	require.Equal(t, config.Database{Provider: "postgresql", DatabaseURI: uri}, p.Databases["default"])
	require.Equal(t, config.EventStore{Provider: "message_db", DatabaseURI: uri}, p.EventStore)
	// Production relays to Redis Streams, which partitions delivery.
	require.Equal(t, config.Broker{Provider: "redis", URI: "redis://127.0.0.1:6379/0"}, p.OutboxBroker())
	// Production runs more instances per module than cores: a command
	// handler waits on PostgreSQL inside its call.
	require.Equal(t, 16, p.Plugins.Limits.MaxInstances)
	// Every other value in production.toml repeats a default.
	want := config.Default()
	want.Databases = p.Databases
	want.EventStore = p.EventStore
	want.Brokers = p.Brokers
	want.Plugins.Limits.MaxInstances = p.Plugins.Limits.MaxInstances
	require.Equal(t, want, p)
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(*config.Config)
		want   []string
	}{
		{"defaults", func(*config.Config) {}, nil},
		// databases
		{"database provider empty", func(c *config.Config) { c.Databases["default"] = config.Database{} },
			[]string{"databases.default.provider is required (memory | postgresql)"}},
		{"database provider unknown", func(c *config.Config) { c.Databases["aux"] = config.Database{Provider: "mysql"} },
			[]string{`databases.aux.provider must be "memory" or "postgresql" (got "mysql")`}},
		{"postgresql without uri", func(c *config.Config) { c.Databases["default"] = config.Database{Provider: "postgresql"} },
			[]string{`databases.default.database_uri is required when provider = "postgresql" (or set PROTEAN_DATABASE_URL)`}},
		{"postgresql without uri, other name", func(c *config.Config) { c.Databases["aux"] = config.Database{Provider: "postgresql"} },
			[]string{`databases.aux.database_uri is required when provider = "postgresql"`}},
		{"postgresql keyword dsn", func(c *config.Config) {
			c.Databases["default"] = config.Database{Provider: "postgresql", DatabaseURI: "host=db user=u"}
		}, nil},
		// event store
		{"event store provider empty", func(c *config.Config) { c.EventStore.Provider = "" },
			[]string{"event_store.provider is required (memory | message_db)"}},
		{"event store provider unknown", func(c *config.Config) { c.EventStore.Provider = "postgresql" },
			[]string{`event_store.provider must be "memory" or "message_db" (got "postgresql")`}},
		{"message_db without uri", func(c *config.Config) { c.EventStore.Provider = "message_db" },
			[]string{`event_store.database_uri is required when provider = "message_db" (or set PROTEAN_DATABASE_URL)`}},
		// brokers
		{"broker provider empty", func(c *config.Config) { c.Brokers["default"] = config.Broker{} },
			[]string{"brokers.default.provider is required (inline | redis)"}},
		{"broker provider unknown is left to the host", func(c *config.Config) {
			c.Brokers["default"] = config.Broker{Provider: "kafka", URI: "kafka://x"}
		}, nil},
		{"redis without uri", func(c *config.Config) { c.Brokers["default"] = config.Broker{Provider: "redis"} },
			[]string{`brokers.default.uri is required when provider = "redis" (or set PROTEAN_REDIS_URL)`}},
		{"redis without uri, other name", func(c *config.Config) { c.Brokers["ev"] = config.Broker{Provider: "redis"} },
			[]string{`brokers.ev.uri is required when provider = "redis"`}},
		{"redis bad scheme", func(c *config.Config) {
			c.Brokers["default"] = config.Broker{Provider: "redis", URI: "http://u:secret@h"}
		}, []string{`brokers.default.uri must be a redis://, rediss:// or unix:// URL (got scheme "http")`}},
		{"redis unparsable", func(c *config.Config) {
			c.Brokers["default"] = config.Broker{Provider: "redis", URI: "redis://u:secret@h:port\x7f"}
		}, []string{"brokers.default.uri is not a valid URL"}},
		{"rediss and unix", func(c *config.Config) {
			c.Brokers["default"] = config.Broker{Provider: "redis", URI: "rediss://h:6380/0"}
			c.Brokers["sock"] = config.Broker{Provider: "redis", URI: "unix:///run/redis.sock"}
		}, nil},
		// outbox
		{"outbox broker empty", func(c *config.Config) { c.Outbox.Broker = "" },
			[]string{"outbox.broker must not be empty"}},
		{"outbox broker unknown", func(c *config.Config) {
			c.Outbox.Broker = "events"
			c.Brokers["zeta"] = config.Broker{Provider: "inline"}
		}, []string{`outbox.broker names "events", which is not a configured broker (have: default, zeta)`}},
		{"outbox other broker", func(c *config.Config) {
			c.Outbox.Broker = "events"
			c.Brokers["events"] = config.Broker{Provider: "inline"}
		}, nil},
		{"messages_per_tick", func(c *config.Config) { c.Outbox.MessagesPerTick = 0 },
			[]string{"outbox.messages_per_tick must be > 0 (got 0)"}},
		{"tick_interval_ms", func(c *config.Config) { c.Outbox.TickIntervalMS = -1 },
			[]string{"outbox.tick_interval_ms must be > 0 (got -1)"}},
		{"outbox max_retries", func(c *config.Config) { c.Outbox.MaxRetries = 0 },
			[]string{"outbox.max_retries must be > 0 (got 0)"}},
		{"base_retry_delay_ms", func(c *config.Config) { c.Outbox.BaseRetryDelayMS = 0 },
			[]string{"outbox.base_retry_delay_ms must be > 0 (got 0)"}},
		{"max_retry_delay_ms", func(c *config.Config) { c.Outbox.MaxRetryDelayMS = 0 },
			[]string{"outbox.max_retry_delay_ms must be > 0 (got 0)"}},
		{"max below base", func(c *config.Config) { c.Outbox.MaxRetryDelayMS = 500 },
			[]string{"outbox.max_retry_delay_ms must be >= outbox.base_retry_delay_ms (got 500 < 1000)"}},
		{"max equals base", func(c *config.Config) { c.Outbox.MaxRetryDelayMS = 1000 }, nil},
		{"jitter above 1", func(c *config.Config) { c.Outbox.BackoffJitter = 1.5 },
			[]string{"outbox.backoff_jitter must be between 0 and 1 (got 1.5)"}},
		{"jitter negative", func(c *config.Config) { c.Outbox.BackoffJitter = -0.1 },
			[]string{"outbox.backoff_jitter must be between 0 and 1 (got -0.1)"}},
		{"jitter NaN", func(c *config.Config) { c.Outbox.BackoffJitter = math.NaN() },
			[]string{"outbox.backoff_jitter must be between 0 and 1 (got NaN)"}},
		{"jitter bounds", func(c *config.Config) { c.Outbox.BackoffJitter = 1 }, nil},
		{"lock_timeout_ms", func(c *config.Config) { c.Outbox.LockTimeoutMS = 0 },
			[]string{"outbox.lock_timeout_ms must be > 0 (got 0)"}},
		{"relay_lease_ms zero holds no lease", func(c *config.Config) { c.Outbox.RelayLeaseMS = 0 }, nil},
		{"relay_lease_ms too short", func(c *config.Config) { c.Outbox.RelayLeaseMS = 99 },
			[]string{"outbox.relay_lease_ms must be 0 (no lease: every relay claims) or at least 100 (got 99)"}},
		{"relay_lease_ms negative", func(c *config.Config) { c.Outbox.RelayLeaseMS = -1 },
			[]string{"outbox.relay_lease_ms must be >= 0 (got -1)"}},
		{"retention zero keeps", func(c *config.Config) {
			c.Outbox.PublishedRetentionHours = 0
			c.Outbox.AbandonedRetentionHours = 0
		}, nil},
		{"retention negative", func(c *config.Config) {
			c.Outbox.PublishedRetentionHours = -1
			c.Outbox.AbandonedRetentionHours = -2
		}, []string{
			"outbox.published_retention_hours must be >= 0, 0 keeps rows forever (got -1)",
			"outbox.abandoned_retention_hours must be >= 0, 0 keeps rows forever (got -2)",
		}},
		{"retention overflow", func(c *config.Config) { c.Outbox.PublishedRetentionHours = math.MaxInt },
			[]string{fmt.Sprintf("outbox.published_retention_hours must be <= 2562047 (got %d)", math.MaxInt)}},
		{"restart_republish_seconds zero", func(c *config.Config) { c.Outbox.RestartRepublishSeconds = 0 }, nil},
		{"restart_republish_seconds negative", func(c *config.Config) { c.Outbox.RestartRepublishSeconds = -1 },
			[]string{"outbox.restart_republish_seconds must be >= 0, 0 republishes nothing after a restart (got -1)"}},
		{"restart_republish_seconds past the retention", func(c *config.Config) {
			c.Outbox.PublishedRetentionHours = 1
			c.Outbox.RestartRepublishSeconds = 3601
		}, []string{"outbox.restart_republish_seconds must be within outbox.published_retention_hours (got 3601 s > 1 h): older rows are gone"}},
		// server.partitioning
		{"lease_ttl_ms zero", func(c *config.Config) { c.Server.Partitioning.LeaseTTLMS = 0 },
			[]string{"server.partitioning.lease_ttl_ms must be > 0 (got 0)"}},
		{"lease_ttl_ms overflow", func(c *config.Config) { c.Server.Partitioning.LeaseTTLMS = math.MaxInt },
			[]string{fmt.Sprintf("server.partitioning.lease_ttl_ms must be <= 9223372036854 (got %d)", math.MaxInt)}},
		{"heartbeat zero", func(c *config.Config) { c.Server.Partitioning.HeartbeatIntervalSeconds = ptr(0.0) },
			[]string{"server.partitioning.heartbeat_interval_seconds must be > 0 (got 0)"}},
		{"heartbeat inf", func(c *config.Config) { c.Server.Partitioning.HeartbeatIntervalSeconds = ptr(math.Inf(1)) },
			[]string{"server.partitioning.heartbeat_interval_seconds must be a finite number (got +Inf)"}},
		{"heartbeat equals ttl", func(c *config.Config) { c.Server.Partitioning.HeartbeatIntervalSeconds = ptr(15.0) },
			[]string{"server.partitioning.heartbeat_interval_seconds must be < server.partitioning.lease_ttl_ms (got 15s >= 15s)"}},
		{"heartbeat just below ttl", func(c *config.Config) { c.Server.Partitioning.HeartbeatIntervalSeconds = ptr(14.999) }, nil},
		{"heartbeat with bad ttl reports ttl only", func(c *config.Config) {
			c.Server.Partitioning.LeaseTTLMS = -5
			c.Server.Partitioning.HeartbeatIntervalSeconds = ptr(3.0)
		}, []string{"server.partitioning.lease_ttl_ms must be > 0 (got -5)"}},
		{"tiny ttl derives heartbeat", func(c *config.Config) { c.Server.Partitioning.LeaseTTLMS = 1 }, nil},
		{"poll zero", func(c *config.Config) { c.Server.Partitioning.PollIntervalSeconds = 0 },
			[]string{"server.partitioning.poll_interval_seconds must be > 0 (got 0)"}},
		{"poll NaN", func(c *config.Config) { c.Server.Partitioning.PollIntervalSeconds = math.NaN() },
			[]string{"server.partitioning.poll_interval_seconds must be a finite number (got NaN)"}},
		{"poll overflow", func(c *config.Config) { c.Server.Partitioning.PollIntervalSeconds = 1e10 },
			[]string{"server.partitioning.poll_interval_seconds must be <= 9.223372036e+09 (got 1e+10)"}},
		{"reap negative", func(c *config.Config) { c.Server.Partitioning.ReapIdleMS = -1 },
			[]string{"server.partitioning.reap_idle_ms must be >= 0 (got -1)"}},
		{"reap zero", func(c *config.Config) { c.Server.Partitioning.ReapIdleMS = 0 }, nil},
		{"ack delay negative", func(c *config.Config) { c.Server.Partitioning.AckDelayMS = -1 },
			[]string{"server.partitioning.ack_delay_ms must be >= 0 (got -1)"}},
		{"ack delay zero", func(c *config.Config) { c.Server.Partitioning.AckDelayMS = 0 }, nil},
		{"warn negative", func(c *config.Config) { c.Server.Partitioning.WarnLivePartitions = -1 },
			[]string{"server.partitioning.warn_live_partitions must be >= 0, 0 turns the warning off (got -1)"}},
		// server.priority_lanes
		{"suffix empty", func(c *config.Config) { c.Server.PriorityLanes.BackfillSuffix = "" },
			[]string{"server.priority_lanes.backfill_suffix must not be empty"}},
		{"suffix colon", func(c *config.Config) { c.Server.PriorityLanes.BackfillSuffix = "a:b" },
			[]string{`server.priority_lanes.backfill_suffix must not contain a colon (got "a:b")`}},
		{"suffix dlq", func(c *config.Config) { c.Server.PriorityLanes.BackfillSuffix = "dlq" },
			[]string{`server.priority_lanes.backfill_suffix must not be "dlq", the DLQ lane`}},
		{"suffix sentinel", func(c *config.Config) { c.Server.PriorityLanes.BackfillSuffix = "__lease__" },
			[]string{`server.priority_lanes.backfill_suffix must not use the reserved '__name__' sentinel form (got "__lease__")`}},
		{"suffix custom", func(c *config.Config) {
			c.Server.PriorityLanes = config.PriorityLanes{Enabled: true, Threshold: -3, BackfillSuffix: "mylane"}
		}, nil},
		// server.stream_subscription
		{"subscription max_retries zero: one attempt", func(c *config.Config) { c.Server.StreamSubscription.MaxRetries = 0 }, nil},
		{"subscription max_retries negative", func(c *config.Config) { c.Server.StreamSubscription.MaxRetries = -1 },
			[]string{"server.stream_subscription.max_retries must be between 0 and 1000 (retries after the first attempt; got -1)"}},
		{"subscription max_retries too many", func(c *config.Config) { c.Server.StreamSubscription.MaxRetries = 1001 },
			[]string{"server.stream_subscription.max_retries must be between 0 and 1000 (retries after the first attempt; got 1001)"}},
		{"max retry delay below the delay", func(c *config.Config) {
			c.Server.StreamSubscription.RetryDelaySeconds, c.Server.StreamSubscription.MaxRetryDelaySeconds = 10, 5
		}, []string{"server.stream_subscription.max_retry_delay_seconds must be >= server.stream_subscription.retry_delay_seconds (got 5 < 10)"}},
		{"max retry delay zero", func(c *config.Config) { c.Server.StreamSubscription.MaxRetryDelaySeconds = 0 },
			[]string{"server.stream_subscription.max_retry_delay_seconds must be > 0 (got 0)"}},
		{"max retry delay past an hour", func(c *config.Config) { c.Server.StreamSubscription.MaxRetryDelaySeconds = 3601 },
			[]string{"server.stream_subscription.max_retry_delay_seconds must be <= 3600 (got 3601)"}},
		{"retry delay negative", func(c *config.Config) { c.Server.StreamSubscription.RetryDelaySeconds = -1 },
			[]string{"server.stream_subscription.retry_delay_seconds must be >= 0 (got -1)"}},
		{"retry delay zero", func(c *config.Config) { c.Server.StreamSubscription.RetryDelaySeconds = 0 }, nil},
		// plugins
		{"plugins dir", func(c *config.Config) { c.Plugins.Dir = "" },
			[]string{"plugins.dir must not be empty"}},
		{"no cache dir", func(c *config.Config) { c.Plugins.CacheDir = "" }, nil},
		{"cache unbounded", func(c *config.Config) { c.Plugins.CacheMaxMB = 0 }, nil},
		{"document cache off", func(c *config.Config) { c.Plugins.DocumentCacheMB = 0 }, nil},
		{"document cache negative", func(c *config.Config) { c.Plugins.DocumentCacheMB = -1 }, []string{"plugins.document_cache_mb must be >= 0 (got -1; 0 keeps no cache)"}},
		{"cache bound negative", func(c *config.Config) { c.Plugins.CacheMaxMB = -1 },
			[]string{"plugins.cache_max_mb must be >= 0 (got -1; 0 is unbounded)"}},
		{"memory zero", func(c *config.Config) { c.Plugins.Limits.MemoryMB = 0 },
			[]string{"plugins.limits.memory_mb must be between 1 and 4096, the wasm32 address space (got 0)"}},
		{"memory too large", func(c *config.Config) { c.Plugins.Limits.MemoryMB = 4097 },
			[]string{"plugins.limits.memory_mb must be between 1 and 4096, the wasm32 address space (got 4097)"}},
		{"memory max", func(c *config.Config) { c.Plugins.Limits.MemoryMB = 4096 }, nil},
		{"timeout", func(c *config.Config) { c.Plugins.Limits.TimeoutMS = 0 },
			[]string{"plugins.limits.timeout_ms must be > 0 (got 0)"}},
		{"max output", func(c *config.Config) { c.Plugins.Limits.MaxOutputBytes = 0 },
			[]string{"plugins.limits.max_output_bytes must be > 0 (got 0)"}},
		{"manifest timeout", func(c *config.Config) { c.Plugins.Limits.ManifestTimeoutMS = -1 },
			[]string{"plugins.limits.manifest_timeout_ms must be > 0 (got -1)"}},
		// tenants
		{"instance idle never", func(c *config.Config) { c.Plugins.Limits.InstanceIdleMS = 0 }, nil},
		{"instance idle negative", func(c *config.Config) { c.Plugins.Limits.InstanceIdleMS = -1 },
			[]string{"plugins.limits.instance_idle_ms must be >= 0 (got -1)"}},
		{"code idle never", func(c *config.Config) { c.Plugins.Limits.CodeIdleMS = 0 }, nil},
		{"code idle negative", func(c *config.Config) { c.Plugins.Limits.CodeIdleMS = -1 },
			[]string{"plugins.limits.code_idle_ms must be >= 0 (got -1)"}},
		{"tenant overrides", func(c *config.Config) {
			c.Tenants["acme"] = config.Tenant{MemoryMB: ptr(0), TimeoutMS: ptr(-1), MaxOutputBytes: ptr[int64](0), InstanceIdleMS: ptr(-5)}
			c.Tenants["beta"] = config.Tenant{InstanceIdleMS: ptr(0), CodeIdleMS: ptr(0)}
			c.Tenants["gamma"] = config.Tenant{CodeIdleMS: ptr(-2)}
		}, []string{
			"tenants.acme.memory_mb must be between 1 and 4096, the wasm32 address space (got 0)",
			"tenants.acme.timeout_ms must be > 0 (got -1)",
			"tenants.acme.max_output_bytes must be > 0 (got 0)",
			"tenants.acme.instance_idle_ms must be >= 0 (got -5)",
			"tenants.gamma.code_idle_ms must be >= 0 (got -2)",
		}},
		{"tenant modules", func(c *config.Config) {
			c.Tenants["acme"] = config.Tenant{Modules: []string{"orders", "", "orders"}}
			c.Tenants["beta"] = config.Tenant{Modules: []string{"billing", "orders"}}
		}, []string{
			"tenants.acme.modules[1] must not be empty",
			`tenants.acme.modules lists "orders" twice`,
			`tenants.beta.modules lists "orders", which already belongs to tenants.acme`,
		}},
		// http
		{"listen no port", func(c *config.Config) { c.HTTP.Listen = "localhost" },
			[]string{`http.listen must be host:port, e.g. 127.0.0.1:8080 (got "localhost")`}},
		{"listen empty", func(c *config.Config) { c.HTTP.Listen = "" },
			[]string{`http.listen must be host:port, e.g. 127.0.0.1:8080 (got "")`}},
		{"listen bad port", func(c *config.Config) { c.HTTP.Listen = "127.0.0.1:http" },
			[]string{`http.listen has a bad port "http" (want 0..65535)`}},
		{"listen port too big", func(c *config.Config) { c.HTTP.Listen = ":70000" },
			[]string{`http.listen has a bad port "70000" (want 0..65535)`}},
		{"listen any port", func(c *config.Config) { c.HTTP.Listen = ":0" }, nil},
		{"listen ipv6", func(c *config.Config) { c.HTTP.Listen = "[::1]:8080" }, nil},
		{"admin listen", func(c *config.Config) { c.HTTP.AdminListen = "127.0.0.1:9070" }, nil},
		{"admin listen no port", func(c *config.Config) { c.HTTP.AdminListen = "localhost" },
			[]string{`http.admin_listen must be host:port, e.g. 127.0.0.1:9070 (got "localhost")`}},
		{"admin listen is listen", func(c *config.Config) { c.HTTP.AdminListen = c.HTTP.Listen },
			[]string{`http.admin_listen must differ from http.listen ("127.0.0.1:8080"): leave it out to serve the admin routes there`}},
		{"auth key of an unknown tenant", func(c *config.Config) {
			c.HTTP.Auth.Keys = []config.APIKey{{Tenant: "nobody", Role: "read", SHA256: strings.Repeat("ab", 32)}}
		}, []string{`http.auth.keys key 0: tenant "nobody" is not configured (add [tenants.nobody], or use "default")`}},
		{"auth key with a bad hash and role", func(c *config.Config) {
			c.HTTP.Auth.Keys = []config.APIKey{{Tenant: "default", Role: "read", SHA256: "abc"}}
		}, []string{"http.auth.keys key 0: sha256 must be 64 hex digits (protean-host keys new prints it)"}},
		{"oidc incomplete", func(c *config.Config) { c.HTTP.Auth.OIDC = config.OIDC{JWKSURL: "http://idp.example.com/keys"} }, []string{
			"http.auth.oidc.issuer must be set (the tokens' iss)",
			"http.auth.oidc.audience must be set (one of the tokens' aud)",
			`http.auth.oidc.jwks_url must be an https URL (http only on loopback; got "http://idp.example.com/keys")`,
		}},
		{"oidc two key sets and a big skew", func(c *config.Config) {
			c.HTTP.Auth.OIDC = config.OIDC{Issuer: "i", Audience: "a", JWKSURL: "https://idp/keys", JWKSFile: "keys.json", ClockSkewSeconds: 600}
		}, []string{"http.auth.oidc set exactly one of jwks_url and jwks_file", "http.auth.oidc.clock_skew_seconds must be 0..300 (got 600; 0 means 1m0s)"}},
		{"oidc on a loopback http JWKS", func(c *config.Config) {
			c.HTTP.Auth.OIDC = config.OIDC{Issuer: "i", Audience: "a", JWKSURL: "http://127.0.0.1:9000/keys"}
		}, nil},
		{"auth keys of the default tenant and an admin", func(c *config.Config) {
			c.HTTP.Auth.Keys = []config.APIKey{{Tenant: "default", Role: "write", SHA256: strings.Repeat("ab", 32)},
				{Role: "admin", SHA256: strings.Repeat("cd", 32)}}
		}, nil},
		{"write timeout within the read wait", func(c *config.Config) { c.HTTP.ReadBodyTimeoutMS, c.HTTP.WriteTimeoutMS = 1000, 5000 },
			[]string{"http.write_timeout_ms must be > http.read_wait_ms, or it cuts a ?min_position wait (got 5000 <= 5000)"}},
		{"write timeout within the body timeout", func(c *config.Config) { c.HTTP.ReadBodyTimeoutMS, c.HTTP.WriteTimeoutMS = 9000, 8000 },
			[]string{"http.write_timeout_ms must be > http.read_body_timeout_ms, or it cuts a command whose body came in time (got 8000 <= 9000)"}},
		{"http limits zero", func(c *config.Config) {
			c.HTTP.ReadHeaderTimeoutMS, c.HTTP.ReadBodyTimeoutMS, c.HTTP.IdleTimeoutMS = 0, 0, 0
			c.HTTP.MaxHeaderBytes, c.HTTP.MaxConnections = 0, -1
		}, []string{
			"http.read_header_timeout_ms must be > 0 (got 0)", "http.read_body_timeout_ms must be > 0 (got 0)",
			"http.idle_timeout_ms must be > 0 (got 0)", "http.max_header_bytes must be > 0 (got 0)",
			"http.max_connections must be > 0 (got -1)",
		}},
		{"telemetry", func(c *config.Config) {
			c.Telemetry = config.Telemetry{Tracing: true, Endpoint: "http://collector:4318/v1/traces", SampleRatio: 0.25}
		}, nil},
		{"telemetry bad", func(c *config.Config) {
			c.Telemetry = config.Telemetry{Tracing: true, Endpoint: "collector:4318", SampleRatio: 1.5}
		}, []string{
			`telemetry.endpoint must be an http:// or https:// URL, such as http://collector:4318/v1/traces (got "collector:4318")`,
			"telemetry.sample_ratio must be within [0, 1] (got 1.5)",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := config.Default()
			tt.mutate(&c)
			err := c.Validate()
			require.Equal(t, tt.want, lines(err))
			for _, line := range tt.want {
				require.NotContains(t, line, "secret")
			}
			if err != nil {
				var fe *config.FieldError
				require.ErrorAs(t, err, &fe)
				require.True(t, strings.HasPrefix(tt.want[0], fe.Key+" "), "first error names %q", fe.Key)
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	t.Parallel()
	c := config.Default()
	c.Server.Partitioning.LeaseTTLMS = 0
	c.Plugins.Dir = ""
	c.HTTP.Listen = "x"
	err := c.Validate()
	require.Len(t, lines(err), 3)
	var keys []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *config.FieldError
		require.True(t, errors.As(e, &fe))
		keys = append(keys, fe.Key)
	}
	require.Equal(t, []string{"server.partitioning.lease_ttl_ms", "plugins.dir", "http.listen"}, keys)
}

func TestHelpers(t *testing.T) {
	t.Parallel()
	c := config.Default()
	c.Brokers["events"] = config.Broker{Provider: "redis", URI: "redis://h/0"}
	c.Outbox.Broker = "events"
	c.Tenants["acme"] = config.Tenant{Modules: []string{"orders"}, MemoryMB: ptr(128), MaxOutputBytes: ptr[int64](1024),
		TenantShapeLimits: config.TenantShapeLimits{MaxNestingDepth: ptr(20000)},
		TenantCallLimits:  config.TenantCallLimits{MaxHostCalls: ptr(500)}}
	c.Tenants["beta"] = config.Tenant{Modules: []string{"billing"}}
	c.Tenants["trusted"] = config.Tenant{Modules: []string{"ledger"}, Interruptible: ptr(false)}

	b, ok := c.Broker("events")
	require.True(t, ok)
	require.Equal(t, "redis", b.Provider)
	_, ok = c.Broker("nope")
	require.False(t, ok)
	require.Equal(t, b, c.OutboxBroker())

	name, ok := c.TenantOf("orders")
	require.True(t, ok)
	require.Equal(t, "acme", name)
	_, ok = c.TenantOf("shipping")
	require.False(t, ok)

	require.Equal(t, config.Limits{MemoryMB: 128, TimeoutMS: 5000, MaxOutputBytes: 1024, ManifestTimeoutMS: 2000, Interruptible: true,
		MaxTableElements: 100000, MaxModuleBytes: 32 << 20, CompileTimeoutMS: 10000, RecycleAboveMB: 32, InstanceIdleMS: 60000, LogLinesPerSecond: 10, LogBurst: 100, MaxCascadeDepth: 16, MaxFollowUps: 256,
		ShapeLimits: config.ShapeLimits{MaxFunctions: 100_000, MaxFunctionBytes: 1 << 20, MaxFunctionLocals: 50_000, MaxModuleLocals: 1_000_000,
			MaxNestingDepth: 20000, MaxNestingCost: 100_000_000},
		CallLimits: config.CallLimits{MaxHostCalls: 500, MaxHostBytes: 64 << 20, MaxReadBytes: 1 << 20}},
		c.ModuleLimits("orders"))
	require.False(t, c.ModuleLimits("ledger").Interruptible, "a trusted tenant opts out")
	require.Equal(t, c.Plugins.Limits, c.ModuleLimits("billing"), "a tenant without overrides inherits")
	require.Equal(t, c.Plugins.Limits, c.ModuleLimits("shipping"), "a module without a tenant inherits")

	c.Outbox.Broker = "gone"
	require.Equal(t, config.Broker{}, c.OutboxBroker())
}

func ExampleConfig_Validate() {
	c := config.Default()
	c.Server.Partitioning.LeaseTTLMS = 3000
	c.Server.Partitioning.HeartbeatIntervalSeconds = new(5.0)
	c.Outbox.Broker = "events"
	fmt.Println(c.Validate())
	// Output:
	// outbox.broker names "events", which is not a configured broker (have: default)
	// server.partitioning.heartbeat_interval_seconds must be < server.partitioning.lease_ttl_ms (got 5s >= 3s)
}

// The shape and call limits are read from [plugins.limits] and a
// tenant's table (embedded structs: their keys are the table's own), and
// must be positive.
func TestLoadShapeLimits(t *testing.T) {
	c, err := config.Load(writeFile(t, `
[plugins.limits]
max_nesting_depth = 1000
max_functions = 7
max_host_calls = 99
[tenants.big]
modules = ["gen"]
max_nesting_depth = 30000
max_read_bytes = 4096
`))
	require.NoError(t, err)
	require.Equal(t, 1000, c.Plugins.Limits.MaxNestingDepth)
	require.Equal(t, 7, c.Plugins.Limits.MaxFunctions)
	require.Equal(t, 50_000, c.Plugins.Limits.MaxFunctionLocals, "unset keys keep their defaults")
	require.Equal(t, 30000, c.ModuleLimits("gen").MaxNestingDepth)
	require.Equal(t, 7, c.ModuleLimits("gen").MaxFunctions)
	require.Equal(t, 99, c.ModuleLimits("gen").MaxHostCalls)
	require.Equal(t, 4096, c.ModuleLimits("gen").MaxReadBytes)
	require.Equal(t, 1<<20, c.Plugins.Limits.MaxReadBytes)

	c, err = config.Load(writeFile(t, `
[plugins.limits]
instance_idle_ms = 5000
[tenants.rare]
modules = ["nightly"]
instance_idle_ms = 0
code_idle_ms = 600000
`))
	require.NoError(t, err)
	require.Equal(t, time.Duration(0), c.ModuleLimits("orders").CodeIdle(), "the code is kept by default")
	require.Equal(t, 10*time.Minute, c.ModuleLimits("nightly").CodeIdle())
	require.Equal(t, 5*time.Second, c.ModuleLimits("orders").InstanceIdle())
	require.Equal(t, time.Duration(0), c.ModuleLimits("nightly").InstanceIdle(), "the tenant keeps its idle instances")

	_, err = config.Load(writeFile(t, `
[plugins.limits]
max_nesting_cost = 0
max_host_bytes = 0
[tenants.big]
modules = ["gen"]
max_function_locals = -1
max_host_calls = -1
`))
	require.ErrorContains(t, err, "plugins.limits.max_nesting_cost")
	require.ErrorContains(t, err, "tenants.big.max_function_locals")
	require.ErrorContains(t, err, "plugins.limits.max_host_bytes")
	require.ErrorContains(t, err, "tenants.big.max_host_calls")
}

func TestLoadPluginFileRules(t *testing.T) {
	c, err := config.Load(writeFile(t, "[plugins]\nfollow_links = false\nrefuse_writable = true\n"))
	require.NoError(t, err)
	require.False(t, c.Plugins.FollowLinks)
	require.True(t, c.Plugins.RefuseWritable)

	_, err = config.Load(writeFile(t, "[plugins]\nfollow_links = \"inside\"\n"))
	require.ErrorContains(t, err, "follow_links")
}

// TestCheckExposure: only a loopback listen address may go without keys,
// unless the config says so.
func TestCheckExposure(t *testing.T) {
	for listen, exposed := range map[string]bool{
		"127.0.0.1:8080": false, "[::1]:8080": false, "localhost:8080": false, "127.0.0.2:0": false,
		"0.0.0.0:8080": true, ":8080": true, "10.0.0.1:8080": true, "[::]:8080": true, "example.com:80": true,
	} {
		h := config.HTTP{Listen: listen}
		if exposed {
			require.ErrorContains(t, h.CheckExposure(), "is not a loopback address", listen)
		} else {
			require.NoError(t, h.CheckExposure(), listen)
		}
		h.Auth.AllowUnauthenticated = true
		require.NoError(t, h.CheckExposure(), listen)
		h.Auth = config.HTTPAuth{Keys: []config.APIKey{{Role: "admin", SHA256: strings.Repeat("ab", 32)}}}
		require.NoError(t, h.CheckExposure(), listen)
		// The admin listener is checked the same way.
		h = config.HTTP{Listen: "127.0.0.1:8080", AdminListen: listen}
		if exposed {
			require.ErrorContains(t, h.CheckExposure(), "http.admin_listen "+listen+" is not a loopback address", listen)
		} else {
			require.NoError(t, h.CheckExposure(), listen)
		}
	}
}
