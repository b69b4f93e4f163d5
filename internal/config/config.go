package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/proteanhq/protean-host/internal/auth"
	"github.com/proteanhq/protean-host/internal/httpapi"
	"github.com/proteanhq/protean-host/internal/idempotency"
	"github.com/proteanhq/protean-host/internal/redispartition"

	"github.com/BurntSushi/toml"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/engine"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/relay"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/partition"
)

// Environment variables that override connection strings, so secrets need
// not be written into the file. An empty value counts as unset.
const (
	// EnvDatabaseURL overrides databases.default.database_uri and
	// event_store.database_uri.
	EnvDatabaseURL = "PROTEAN_DATABASE_URL"
	// EnvRedisURL overrides brokers.default.uri.
	EnvRedisURL = "PROTEAN_REDIS_URL"
)

// Provider names the file may use.
const (
	ProviderMemory     = "memory"     // databases, event_store
	ProviderPostgreSQL = "postgresql" // databases
	ProviderMessageDB  = "message_db" // event_store
	ProviderInline     = "inline"     // brokers
	ProviderRedis      = "redis"      // brokers
)

// DefaultName is the name of the default database and broker.
const DefaultName = "default"

// Config is the host's whole configuration. The zero value is not useful;
// start from [Default] or [Load].
type Config struct {
	Databases  map[string]Database `toml:"databases"`
	EventStore EventStore          `toml:"event_store"`
	Brokers    map[string]Broker   `toml:"brokers"`
	Outbox     Outbox              `toml:"outbox"`
	Server     Server              `toml:"server"`
	Plugins    Plugins             `toml:"plugins"`
	Tenants    map[string]Tenant   `toml:"tenants"`
	HTTP       HTTP                `toml:"http"`
	Telemetry  Telemetry           `toml:"telemetry"`
}

// Telemetry is the [telemetry] table: OpenTelemetry tracing (package
// telemetry, docs/tracing.md). The standard OTEL_ variables configure what
// a key leaves unset (OTEL_EXPORTER_OTLP_ENDPOINT and _TRACES_ENDPOINT,
// _HEADERS, _TIMEOUT; OTEL_TRACES_SAMPLER and _ARG; OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES), and OTEL_SDK_DISABLED=true turns tracing off.
type Telemetry struct {
	// Tracing exports spans over OTLP/HTTP. Off by default: the host then
	// starts no-op spans only, and writes no trace context into messages.
	Tracing bool `toml:"tracing"`
	// Endpoint is the OTLP/HTTP traces URL, e.g.
	// "http://collector:4318/v1/traces" (default: the OTEL_ variables,
	// else http://localhost:4318/v1/traces).
	Endpoint string `toml:"endpoint"`
	// SampleRatio samples that share of the traces the host begins, in
	// (0, 1]; a request whose traceparent says sampled is always traced.
	// 0 (the default) leaves it to OTEL_TRACES_SAMPLER (default: all).
	SampleRatio float64 `toml:"sample_ratio"`
	// ServiceName is the resource's service.name (default:
	// OTEL_SERVICE_NAME, else "protean-host").
	ServiceName string `toml:"service_name"`
}

// Database is one [databases.NAME] table: where aggregates, projections and
// the outbox live.
type Database struct {
	Provider    string `toml:"provider"`     // "memory" | "postgresql"
	DatabaseURI string `toml:"database_uri"` // required for postgresql
}

// EventStore is the [event_store] table.
type EventStore struct {
	Provider    string `toml:"provider"`     // "memory" | "message_db"
	DatabaseURI string `toml:"database_uri"` // required for message_db
}

// Broker is one [brokers.NAME] table.
type Broker struct {
	Provider string `toml:"provider"` // "inline" | "redis" (others are rejected by the host, not here)
	URI      string `toml:"uri"`      // required for redis
	// KeyPrefix is prepended to every Redis key the host uses (streams,
	// indexes, leases), so several deployments can share one Redis. Empty
	// by default: the keys are then exactly the names in the docs.
	KeyPrefix string `toml:"key_prefix"`
}

// Outbox is the [outbox] table: how the relay claims rows and retries them.
type Outbox struct {
	Broker                  string  `toml:"broker"`                    // a key of [brokers]
	MessagesPerTick         int     `toml:"messages_per_tick"`         // rows claimed per pass
	TickIntervalMS          int     `toml:"tick_interval_ms"`          // pause between passes
	MaxRetries              int     `toml:"max_retries"`               // publish attempts before a row is abandoned
	BaseRetryDelayMS        int     `toml:"base_retry_delay_ms"`       // delay after the first failure, doubled per retry
	MaxRetryDelayMS         int     `toml:"max_retry_delay_ms"`        // cap on that delay
	BackoffJitter           float64 `toml:"backoff_jitter"`            // fraction 0..1 of the delay, randomised
	LockTimeoutMS           int     `toml:"lock_timeout_ms"`           // a claim expires after this; a crashed relay's rows heal
	RelayLeaseMS            int     `toml:"relay_lease_ms"`            // only the lease holder's relay claims; it lapses after this unless renewed; 0: every relay claims
	PublishedRetentionHours int     `toml:"published_retention_hours"` // 0 keeps published rows forever
	AbandonedRetentionHours int     `toml:"abandoned_retention_hours"` // 0 keeps abandoned rows forever
	// RestartRepublishSeconds is how far before the broker's last publish
	// the rows go again when a Redis restarted (or failed over) keeping
	// its epoch marker: what it may have acknowledged and not kept. 0 only
	// marks it anew (appendfsync always and no failover lose nothing).
	RestartRepublishSeconds int `toml:"restart_republish_seconds"`
}

// TickInterval is tick_interval_ms as a duration.
func (o Outbox) TickInterval() time.Duration { return ms(o.TickIntervalMS) }

// BaseRetryDelay is base_retry_delay_ms as a duration.
func (o Outbox) BaseRetryDelay() time.Duration { return ms(o.BaseRetryDelayMS) }

// MaxRetryDelay is max_retry_delay_ms as a duration.
func (o Outbox) MaxRetryDelay() time.Duration { return ms(o.MaxRetryDelayMS) }

// LockTimeout is lock_timeout_ms as a duration.
func (o Outbox) LockTimeout() time.Duration { return ms(o.LockTimeoutMS) }

// RelayLease is relay_lease_ms as a duration; 0 means no lease.
func (o Outbox) RelayLease() time.Duration { return ms(o.RelayLeaseMS) }

// PublishedRetention is published_retention_hours as a duration; 0 means keep.
func (o Outbox) PublishedRetention() time.Duration { return hours(o.PublishedRetentionHours) }

// RestartWindow is restart_republish_seconds as a duration.
func (o Outbox) RestartWindow() time.Duration { return seconds(float64(o.RestartRepublishSeconds)) }

// AbandonedRetention is abandoned_retention_hours as a duration; 0 means keep.
func (o Outbox) AbandonedRetention() time.Duration { return hours(o.AbandonedRetentionHours) }

// Server is the [server] table.
type Server struct {
	Partitioning       Partitioning       `toml:"partitioning"`
	PriorityLanes      PriorityLanes      `toml:"priority_lanes"`
	StreamSubscription StreamSubscription `toml:"stream_subscription"`
	// DefaultSubscriptionType is how events reach handlers: "stream" (the
	// outbox relays to the broker, whose consumers deliver) or
	// "event_store" (package subscription reads the event store with
	// positions committed in the effect transaction). "" picks: event_store
	// when the stores are PostgreSQL and the broker is inline (crash-safe
	// without Redis), stream otherwise. See [Config.SubscriptionType].
	DefaultSubscriptionType string `toml:"default_subscription_type"`
	// EventStoreSubscription is [server.event_store_subscription].
	EventStoreSubscription EventStoreSubscription `toml:"event_store_subscription"`
}

// Subscription types of [server] default_subscription_type.
const (
	SubscriptionStream     = "stream"
	SubscriptionEventStore = "event_store"
)

// SubscriptionType resolves [server] default_subscription_type: as set,
// or, when unset, event_store for PostgreSQL stores with the inline
// broker (the inline broker keeps nothing across a crash; the event store
// and the positions do) and stream otherwise (the embedded default keeps
// everything in memory anyway, and Redis is durable and partitions keys
// across hosts).
func (c Config) SubscriptionType() string {
	if t := c.Server.DefaultSubscriptionType; t != "" {
		return t
	}
	if c.EventStore.Provider == ProviderMessageDB && c.OutboxBroker().Provider == ProviderInline {
		return SubscriptionEventStore
	}
	return SubscriptionStream
}

// EventStoreSubscription is [server.event_store_subscription]: how the
// event-store subscriptions read. Their leases take lease_ttl_ms and
// heartbeat_interval_seconds from [server.partitioning], their retries
// max_retries and retry_delay_seconds from [server.stream_subscription].
type EventStoreSubscription struct {
	BatchSize      int `toml:"batch_size"`       // events read and handled at once
	PollIntervalMS int `toml:"poll_interval_ms"` // a caught-up reader's wait for other hosts' appends
	// GapTimeoutMS is how long a $all subscription holds at a gap in
	// global positions before it abandons it (Protean: 5 s).
	GapTimeoutMS int `toml:"gap_timeout_ms"`
	// KeyWorkers is how many key slots of a sequential_by category one
	// subscription runs in parallel (each key in order); 1 is sequential.
	KeyWorkers int `toml:"key_workers"`
}

// PollInterval is poll_interval_ms as a duration.
func (e EventStoreSubscription) PollInterval() time.Duration { return ms(e.PollIntervalMS) }

// GapTimeout is gap_timeout_ms as a duration.
func (e EventStoreSubscription) GapTimeout() time.Duration { return ms(e.GapTimeoutMS) }

// Partitioning is [server.partitioning]: the lease protocol's timing.
type Partitioning struct {
	LeaseTTLMS int `toml:"lease_ttl_ms"`
	// HeartbeatIntervalSeconds is the lease renew and discovery cadence.
	// nil means lease_ttl_ms/5000 (a 5x margin), derived by
	// [Partitioning.HeartbeatInterval] so it follows a changed TTL.
	HeartbeatIntervalSeconds *float64 `toml:"heartbeat_interval_seconds"`
	PollIntervalSeconds      float64  `toml:"poll_interval_seconds"` // an idle worker's re-read without a wake-up (a safety net)
	ReapIdleMS               int      `toml:"reap_idle_ms"`          // idle time before a partition is retired
	// AckDelayMS is how long a partition worker may hold the acks of what
	// it applied, for its next read to carry them (0: ack at once).
	AckDelayMS int `toml:"ack_delay_ms"`
	// WarnLivePartitions logs a warning when a category has more live
	// partitions than this (Protean's ADR asks for it; the design is meant
	// for hundreds to low thousands). 0 turns the warning off.
	WarnLivePartitions int `toml:"warn_live_partitions"`
}

// LeaseTTL is lease_ttl_ms as a duration.
func (p Partitioning) LeaseTTL() time.Duration { return ms(p.LeaseTTLMS) }

// HeartbeatInterval is heartbeat_interval_seconds, or lease_ttl_ms/5000
// seconds when it is unset.
func (p Partitioning) HeartbeatInterval() time.Duration {
	if p.HeartbeatIntervalSeconds == nil {
		return p.LeaseTTL() / 5
	}
	return seconds(*p.HeartbeatIntervalSeconds)
}

// PollInterval is poll_interval_seconds as a duration.
func (p Partitioning) PollInterval() time.Duration { return seconds(p.PollIntervalSeconds) }

// ReapIdle is reap_idle_ms as a duration.
func (p Partitioning) ReapIdle() time.Duration { return ms(p.ReapIdleMS) }

// AckDelay is ack_delay_ms as a duration.
func (p Partitioning) AckDelay() time.Duration { return ms(p.AckDelayMS) }

// PriorityLanes is [server.priority_lanes]. A row whose priority is below
// Threshold goes to the {category}:{key}:{backfill_suffix} lane when Enabled.
// The suffix is a reserved partition key whether or not lanes are enabled.
type PriorityLanes struct {
	Enabled        bool   `toml:"enabled"`
	Threshold      int    `toml:"threshold"`
	BackfillSuffix string `toml:"backfill_suffix"`
}

// StreamSubscription is [server.stream_subscription]: the one retry policy
// of every delivery path (broker consumer groups, partition workers,
// event-store subscriptions; package delivery).
type StreamSubscription struct {
	// MaxRetries is how many times a message failing on its own is retried
	// after its first attempt, before its partition halts or it is parked
	// (dead-lettered, recorded as failed). Infrastructure failures are
	// never counted.
	MaxRetries int `toml:"max_retries"`
	// RetryDelaySeconds is the pause before the first retry, doubled for
	// each further one up to MaxRetryDelaySeconds, with jitter.
	RetryDelaySeconds    float64 `toml:"retry_delay_seconds"`
	MaxRetryDelaySeconds float64 `toml:"max_retry_delay_seconds"`
}

// RetryDelay is retry_delay_seconds as a duration.
func (s StreamSubscription) RetryDelay() time.Duration { return seconds(s.RetryDelaySeconds) }

// MaxRetryDelay is max_retry_delay_seconds as a duration.
func (s StreamSubscription) MaxRetryDelay() time.Duration { return seconds(s.MaxRetryDelaySeconds) }

// Policy is the retry policy the section sets.
func (s StreamSubscription) Policy() delivery.Policy {
	return delivery.Policy{MaxRetries: s.MaxRetries, Delay: s.RetryDelay(), MaxDelay: s.MaxRetryDelay(), Jitter: delivery.DefaultJitter}
}

// Plugins is the [plugins] table.
type Plugins struct {
	Dir   string `toml:"dir"`   // where *.wasm modules are loaded from, relative to the working directory
	Watch bool   `toml:"watch"` // reload when the directory changes
	// AllowRepartition lets a reload change the partition key of a
	// category that is running (host.ReloaderOptions.AllowRepartition);
	// off, such a reload is rejected and the running set stays.
	AllowRepartition bool `toml:"allow_repartition"`
	// CacheDir holds compiled modules across restarts, relative to the
	// working directory. "" compiles in memory only.
	CacheDir string `toml:"cache_dir"`
	// CacheMaxMB bounds cache_dir: after a compile that wrote to it, the
	// least recently used compiled modules that no loaded module uses are
	// deleted until it fits (host.LoaderOptions.CacheMaxBytes). 0 leaves
	// it unbounded.
	CacheMaxMB int `toml:"cache_max_mb"`
	// FollowLinks follows a symbolic link in dir whose target stays
	// within dir (a Kubernetes ConfigMap or Secret volume, a deploy that
	// swaps a link); false refuses every link. A link out of dir is
	// refused either way (host.LoaderOptions.RefuseLinks).
	FollowLinks bool `toml:"follow_links"`
	// RefuseWritable refuses to load from a plugins directory, a module
	// file or a config file that users other than its owner and group may
	// write; false logs it (WARN) at start and at each reload
	// (host.LoaderOptions.RefuseWritable).
	RefuseWritable bool `toml:"refuse_writable"`
	// GuestConcurrency is how many guest calls run at once on the host,
	// shared between tenants by their weight (host.LoaderOptions.
	// GuestConcurrency, through GuestSlots); 0 means twice GOMAXPROCS when
	// the config names tenants and no sharing when it names none, -1 turns
	// the sharing off (max_instances per module is then the only bound).
	GuestConcurrency int `toml:"guest_concurrency"`
	// DocumentCacheMB bounds the host's cache of the documents that
	// projectors declaring documents_by_key committed, from which their
	// partition units' next loads are answered (engine.Options.
	// DocumentCacheBytes); 0 keeps no cache.
	DocumentCacheMB int    `toml:"document_cache_mb"`
	Limits          Limits `toml:"limits"`
}

// Limits is [plugins.limits]: the sandbox bounds of every module, unless its
// tenant overrides them.
type Limits struct {
	MemoryMB          int   `toml:"memory_mb"`           // guest linear memory cap
	TimeoutMS         int   `toml:"timeout_ms"`          // one handle call
	MaxOutputBytes    int64 `toml:"max_output_bytes"`    // one handle response
	ManifestTimeoutMS int   `toml:"manifest_timeout_ms"` // reading a module's manifest at load
	// Interruptible makes timeout_ms (and cancellation) able to stop a
	// runaway guest (the module is instrumented at load, docs/deadline.md;
	// it costs 1.0-1.2x); set it false only for trusted modules, whose
	// calls then run to completion.
	Interruptible bool `toml:"interruptible"`
	// The sandbox's other bounds (see docs/guarantees.md, Sandbox).
	MaxTableElements  int   `toml:"max_table_elements"`   // every table a module defines; table.grow past it fails
	MaxModuleBytes    int64 `toml:"max_module_bytes"`     // a module file's size
	CompileTimeoutMS  int   `toml:"compile_timeout_ms"`   // compiling a module at load
	RecycleAboveMB    int   `toml:"recycle_above_mb"`     // an instance whose memories grew past this is not reused
	LogLinesPerSecond int   `toml:"log_lines_per_second"` // guest log lines forwarded per module, sustained
	LogBurst          int   `toml:"log_burst"`            // and at once
	// MaxCascadeDepth bounds causation chains across deliveries: a message
	// that many steps from its originating command may not append events
	// or dispatch commands. Host-wide (not overridden per tenant).
	MaxCascadeDepth int `toml:"max_cascade_depth"`
	// MaxFollowUps bounds the events and commands one message may ask for.
	MaxFollowUps int `toml:"max_follow_ups"`
	// MaxInstances caps one module's instances, and so its concurrent
	// calls; 0 means GOMAXPROCS.
	MaxInstances int `toml:"max_instances"`
	// InstanceIdleMS closes an instance idle this long, giving its memory
	// back (the next call makes one again); 0 keeps idle instances.
	InstanceIdleMS int `toml:"instance_idle_ms"`
	// CodeIdleMS releases a module's compiled code (about 24 MB for a Go
	// guest) once it has had no instance and no call this long; the next
	// call compiles it again from the cache_dir (~0.3 s for a Go module
	// with a warm cache). Only with a cache_dir; 0 keeps the code.
	CodeIdleMS int `toml:"code_idle_ms"`
	// A module's shape, checked before it is compiled so a compile bomb
	// is refused without compiling (docs/deadline.md, Compile bombs).
	ShapeLimits
	// What the host does on a guest's behalf in one call (internal/host/budget.go).
	CallLimits
}

// CallLimits bound what the host does on a guest's behalf during one
// protean_handle call (host.Limits): a call over one is stopped.
type CallLimits struct {
	MaxHostCalls int `toml:"max_host_calls"` // load and read_stream calls
	MaxHostBytes int `toml:"max_host_bytes"` // bytes their answers hold, in all
	MaxReadBytes int `toml:"max_read_bytes"` // bytes of events in one read_stream page (one event alone may be larger)
}

// TenantCallLimits are a tenant's overrides of CallLimits; nil inherits.
type TenantCallLimits struct {
	MaxHostCalls *int `toml:"max_host_calls"`
	MaxHostBytes *int `toml:"max_host_bytes"`
	MaxReadBytes *int `toml:"max_read_bytes"`
}

// ShapeLimits bound a module's shape (host.Limits, instrument.Limits).
type ShapeLimits struct {
	MaxFunctions      int `toml:"max_functions"`       // defined functions
	MaxFunctionBytes  int `toml:"max_function_bytes"`  // one function body
	MaxFunctionLocals int `toml:"max_function_locals"` // one function's locals
	MaxModuleLocals   int `toml:"max_module_locals"`   // all functions' locals together
	MaxNestingDepth   int `toml:"max_nesting_depth"`   // blocks, loops and ifs open at once in one function
	MaxNestingCost    int `toml:"max_nesting_cost"`    // sum over functions of the square of their nesting depth
}

// TenantShapeLimits are a tenant's overrides of ShapeLimits; nil inherits.
type TenantShapeLimits struct {
	MaxFunctions      *int `toml:"max_functions"`
	MaxFunctionBytes  *int `toml:"max_function_bytes"`
	MaxFunctionLocals *int `toml:"max_function_locals"`
	MaxModuleLocals   *int `toml:"max_module_locals"`
	MaxNestingDepth   *int `toml:"max_nesting_depth"`
	MaxNestingCost    *int `toml:"max_nesting_cost"`
}

// intLimit is one positive integer limit: its key, a tenant's override
// (nil: none) and the limit it overrides.
type intLimit struct {
	key     string
	set, to *int
}

// intLimits pairs each of a tenant's overrides of the shape and call
// limits with the limit it overrides in l.
func (t *Tenant) intLimits(l *Limits) []intLimit {
	s, c := &t.TenantShapeLimits, &t.TenantCallLimits
	return []intLimit{
		{"max_functions", s.MaxFunctions, &l.MaxFunctions}, {"max_function_bytes", s.MaxFunctionBytes, &l.MaxFunctionBytes},
		{"max_function_locals", s.MaxFunctionLocals, &l.MaxFunctionLocals}, {"max_module_locals", s.MaxModuleLocals, &l.MaxModuleLocals},
		{"max_nesting_depth", s.MaxNestingDepth, &l.MaxNestingDepth}, {"max_nesting_cost", s.MaxNestingCost, &l.MaxNestingCost},
		{"max_host_calls", c.MaxHostCalls, &l.MaxHostCalls}, {"max_host_bytes", c.MaxHostBytes, &l.MaxHostBytes},
		{"max_read_bytes", c.MaxReadBytes, &l.MaxReadBytes},
	}
}

// CompileTimeout is compile_timeout_ms as a duration.
func (l Limits) CompileTimeout() time.Duration { return ms(l.CompileTimeoutMS) }

// InstanceIdle is instance_idle_ms as a duration (0: idle instances are
// kept).
func (l Limits) InstanceIdle() time.Duration { return ms(l.InstanceIdleMS) }

// CodeIdle is code_idle_ms as a duration (0: the code is kept).
func (l Limits) CodeIdle() time.Duration { return ms(l.CodeIdleMS) }

// Timeout is timeout_ms as a duration.
func (l Limits) Timeout() time.Duration { return ms(l.TimeoutMS) }

// ManifestTimeout is manifest_timeout_ms as a duration.
func (l Limits) ManifestTimeout() time.Duration { return ms(l.ManifestTimeoutMS) }

// Tenant is one [tenants.NAME] table: the modules that belong to the tenant
// and the limits that differ from [plugins.limits]. A nil limit inherits.
type Tenant struct {
	// Modules are the tenant's module files, named without ".wasm" (limits
	// apply before a module's manifest is read, so the file name is what
	// is known).
	Modules          []string `toml:"modules"`
	MemoryMB         *int     `toml:"memory_mb"`
	TimeoutMS        *int     `toml:"timeout_ms"`
	MaxOutputBytes   *int64   `toml:"max_output_bytes"`
	Interruptible    *bool    `toml:"interruptible"`
	MaxTableElements *int     `toml:"max_table_elements"`
	MaxModuleBytes   *int64   `toml:"max_module_bytes"`
	CompileTimeoutMS *int     `toml:"compile_timeout_ms"`
	MaxInstances     *int     `toml:"max_instances"`
	InstanceIdleMS   *int     `toml:"instance_idle_ms"`
	CodeIdleMS       *int     `toml:"code_idle_ms"`
	TenantShapeLimits
	TenantCallLimits
	// Weight is the tenant's share of [plugins] guest_concurrency against
	// other tenants' when calls queue for a slot (0 means 1).
	Weight int `toml:"weight"`
	// MaxConcurrency caps the tenant's guest calls running at once, over
	// all its modules (0: half of guest_concurrency).
	MaxConcurrency int `toml:"max_concurrency"`
	// CallsPerSecond caps the rate at which the tenant's guest calls
	// start, over all its modules (0: none); a call over it waits, within
	// its deadline.
	CallsPerSecond float64 `toml:"calls_per_second"`
	// GrantRead lets other tenants read categories this tenant owns:
	// reader tenant → categories. Their modules may subscribe handlers to
	// the category's events, read its streams and load its aggregates,
	// never write there. The owner grants; a reader cannot take.
	GrantRead map[string][]string `toml:"grant_read"`
	// GrantDispatch lets other tenants dispatch this tenant's command
	// types as follow-up commands: reader tenant → command types.
	GrantDispatch map[string][]string `toml:"grant_dispatch"`
	// GrantProjections lets other tenants' read credentials read
	// projections of this tenant's modules at the API: reader tenant →
	// projection names.
	GrantProjections map[string][]string `toml:"grant_projections"`
}

// HTTP is the [http] table.
type HTTP struct {
	Listen string `toml:"listen"` // host:port of the HTTP API
	// AdminListen, if set, is the host:port of the admin routes (the
	// status page, /metrics, /v1/plugins, /v1/ops, /v1/modules), which
	// then leave Listen: clients reach commands and projections, and
	// operators the rest on a private network.
	AdminListen string `toml:"admin_listen"`
	// Pprof serves net/http/pprof under /debug/pprof/ on the admin routes
	// (an admin's, with credentials) and turns on the block and mutex
	// profiles (sampled: a block of 10 µs or more on average, one
	// contention in 100). Off by default.
	Pprof bool `toml:"pprof"`
	// ReadWaitMS bounds how long GET /v1/projections/{name}/{id}?min_position=N
	// waits for the projection to reach N before it answers 504.
	ReadWaitMS int `toml:"read_wait_ms"`
	// IdempotencyTTLSeconds is how long the answer of a command sent with
	// an Idempotency-Key is kept (package idempotency).
	IdempotencyTTLSeconds int `toml:"idempotency_ttl_seconds"`
	// ReadHeaderTimeoutMS bounds reading a request's header, from the
	// connection's first byte (or the end of the last request).
	ReadHeaderTimeoutMS int `toml:"read_header_timeout_ms"`
	// ReadBodyTimeoutMS bounds reading a command's body (408 past it).
	ReadBodyTimeoutMS int `toml:"read_body_timeout_ms"`
	// WriteTimeoutMS bounds a request from the end of its header to the
	// end of its answer: it must exceed ReadWaitMS (a ?min_position wait)
	// and ReadBodyTimeoutMS. A command still running past it completes,
	// but its answer is lost (send an Idempotency-Key to get it again).
	WriteTimeoutMS int `toml:"write_timeout_ms"`
	// IdleTimeoutMS closes a keep-alive connection idle that long.
	IdleTimeoutMS int `toml:"idle_timeout_ms"`
	// MaxHeaderBytes bounds a request's header (431 past it).
	MaxHeaderBytes int `toml:"max_header_bytes"`
	// MaxConnections bounds the open connections. At the bound a new
	// connection closes the oldest idle one; it waits only when every
	// open one is busy (internal/connlimit). The host lowers it, with a
	// warning, to leave 1,024 file descriptors (or half the limit, if
	// less) for its stores, plugins and logs.
	MaxConnections int `toml:"max_connections"`
	// Auth is who may use the API ([http.auth]); no keys: anyone who
	// reaches the listener, which must then be loopback (CheckExposure).
	Auth HTTPAuth `toml:"auth"`
}

// HTTPAuth is the [http.auth] table (package auth).
type HTTPAuth struct {
	// Keys are the API keys ([[http.auth.keys]]): `protean-host keys new
	// TENANT --role ROLE` prints a key once, with its lines. Several may
	// name one tenant and role, so a key rotates without downtime.
	Keys []APIKey `toml:"keys"`
	// OIDC accepts JWT bearer tokens of one issuer ([http.auth.oidc]).
	OIDC OIDC `toml:"oidc"`
	// AllowUnauthenticated lets the host serve a non-loopback address with
	// no keys, where anyone who reaches it acts for every tenant (behind a
	// proxy that authenticates, say).
	AllowUnauthenticated bool `toml:"allow_unauthenticated"`
}

// APIKey is one [[http.auth.keys]] entry: a tenant, a role (read, write,
// operator, deployer, admin) and the key's SHA-256 in hex. An admin key
// needs no tenant.
type APIKey struct {
	Tenant string `toml:"tenant"`
	Role   string `toml:"role"`
	SHA256 string `toml:"sha256"`
}

// OIDC is the [http.auth.oidc] table: tokens of Issuer for Audience,
// signed by a key of JWKSURL or JWKSFile (exactly one), their permissions
// in PermissionsClaim as "TENANT:ROLE" ("*:admin" for admin).
type OIDC struct {
	Issuer           string `toml:"issuer"`
	Audience         string `toml:"audience"`
	JWKSURL          string `toml:"jwks_url"`
	JWKSFile         string `toml:"jwks_file"`
	PermissionsClaim string `toml:"permissions_claim"`
	// ClockSkewSeconds is the skew allowed on a token's expiry.
	ClockSkewSeconds float64 `toml:"clock_skew_seconds"`
}

// Enabled reports whether the table is set at all.
func (o OIDC) Enabled() bool {
	return o.Issuer != "" || o.Audience != "" || o.JWKSURL != "" || o.JWKSFile != ""
}

// Options are the table as package auth takes it.
func (o OIDC) Options() auth.OIDCOptions {
	return auth.OIDCOptions{Issuer: o.Issuer, Audience: o.Audience, JWKSURL: o.JWKSURL, JWKSFile: o.JWKSFile,
		Claim: o.PermissionsClaim, Skew: time.Duration(o.ClockSkewSeconds * float64(time.Second))}
}

// Credentials reports whether any credential is configured (keys, or
// OIDC).
func (a HTTPAuth) Credentials() bool { return len(a.Keys) > 0 || a.OIDC.Enabled() }

// AuthKeys are the keys as package auth takes them.
func (a HTTPAuth) AuthKeys() []auth.Key {
	out := make([]auth.Key, len(a.Keys))
	for i, k := range a.Keys {
		out[i] = auth.Key{Tenant: k.Tenant, Role: auth.Role(k.Role), SHA256: k.SHA256}
	}
	return out
}

// CheckExposure refuses to serve a listen address other than loopback
// with no API keys, unless AllowUnauthenticated says so: anyone who could
// reach it would act for every tenant. The host checks it at start, after
// --listen.
func (h HTTP) CheckExposure() error {
	if h.Auth.Credentials() || h.Auth.AllowUnauthenticated {
		return nil
	}
	for _, a := range []struct{ key, addr string }{{"http.listen", h.Listen}, {"http.admin_listen", h.AdminListen}} {
		if a.addr == "" {
			continue
		}
		if host, _, err := net.SplitHostPort(a.addr); err != nil || !loopback(host) {
			return fmt.Errorf("%s %s is not a loopback address and [http.auth] has no keys: anyone who reaches it "+
				"could act for every tenant; add keys (protean-host keys new TENANT --role ROLE) or [http.auth.oidc], "+
				"or set http.auth.allow_unauthenticated = true", a.key, a.addr)
		}
	}
	return nil
}

// loopback reports whether host is a loopback address or localhost. An
// empty host (every interface) is not.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ReadHeaderTimeout is ReadHeaderTimeoutMS as a duration.
func (h HTTP) ReadHeaderTimeout() time.Duration { return ms(h.ReadHeaderTimeoutMS) }

// ReadBodyTimeout is ReadBodyTimeoutMS as a duration.
func (h HTTP) ReadBodyTimeout() time.Duration { return ms(h.ReadBodyTimeoutMS) }

// WriteTimeout is WriteTimeoutMS as a duration.
func (h HTTP) WriteTimeout() time.Duration { return ms(h.WriteTimeoutMS) }

// IdleTimeout is IdleTimeoutMS as a duration.
func (h HTTP) IdleTimeout() time.Duration { return ms(h.IdleTimeoutMS) }

// IdempotencyTTL is IdempotencyTTLSeconds as a duration.
func (h HTTP) IdempotencyTTL() time.Duration {
	return time.Duration(h.IdempotencyTTLSeconds) * time.Second
}

// ReadWait is ReadWaitMS as a duration.
func (h HTTP) ReadWait() time.Duration { return ms(h.ReadWaitMS) }

// Default returns the configuration used where the file says nothing: the
// embedded setup (memory stores, inline broker) and Protean's defaults for
// everything else. The values are the packages' own (outbox, broker,
// partition, host), so a package used without config behaves as the host
// does with an empty file; the default* helpers, one per section, only
// convert them to the file's units. What no package owns (names, paths, the
// listen address) is set in these functions.
func Default() Config {
	return Config{
		Databases:  map[string]Database{DefaultName: {Provider: ProviderMemory}},
		EventStore: EventStore{Provider: ProviderMemory},
		Brokers:    map[string]Broker{DefaultName: {Provider: ProviderInline}},
		Outbox:     defaultOutbox(),
		Server:     defaultServer(),
		Plugins:    defaultPlugins(),
		Tenants:    map[string]Tenant{},
		HTTP:       defaultHTTP(),
	}
}

// defaultOutbox is the [outbox] table from the outbox relay's defaults.
func defaultOutbox() Outbox {
	d := relay.DefaultOptions()
	return Outbox{
		Broker:                  DefaultName,
		MessagesPerTick:         d.BatchSize,
		TickIntervalMS:          toMS(d.Tick),
		MaxRetries:              outbox.DefaultMaxRetries,
		BaseRetryDelayMS:        toMS(d.BaseDelay),
		MaxRetryDelayMS:         toMS(d.MaxDelay),
		BackoffJitter:           d.Jitter,
		LockTimeoutMS:           toMS(d.LockFor),
		RelayLeaseMS:            toMS(d.LeaseFor),
		PublishedRetentionHours: toHours(d.PublishedRetention),
		AbandonedRetentionHours: toHours(d.AbandonedRetention),
		RestartRepublishSeconds: int(d.RestartWindow / time.Second),
	}
}

// defaultServer is the [server] table from the partition consumer's, the
// broker's and the event-store subscription's defaults.
func defaultServer() Server {
	sub := broker.DefaultOptions()
	part := redispartition.DefaultConsumerOptions()
	return Server{
		Partitioning: Partitioning{
			LeaseTTLMS:               toMS(part.LeaseTTL),
			HeartbeatIntervalSeconds: nil, // lease_ttl_ms/5000, as the consumer's default
			PollIntervalSeconds:      part.Poll.Seconds(),
			ReapIdleMS:               toMS(part.ReapIdle),
			AckDelayMS:               toMS(part.AckDelay),
			WarnLivePartitions:       part.WarnLivePartitions,
		},
		PriorityLanes: PriorityLanes{
			Enabled:        false,
			Threshold:      0,
			BackfillSuffix: partition.DefaultBackfillSuffix,
		},
		StreamSubscription: StreamSubscription{
			MaxRetries:           sub.MaxRetries,
			RetryDelaySeconds:    sub.Delay.Seconds(),
			MaxRetryDelaySeconds: sub.MaxDelay.Seconds(),
		},
		EventStoreSubscription: EventStoreSubscription{
			BatchSize:      subscription.DefaultBatchSize,
			PollIntervalMS: toMS(subscription.DefaultPoll),
			GapTimeoutMS:   toMS(subscription.DefaultGapTimeout),
			KeyWorkers:     subscription.DefaultKeyWorkers,
		},
	}
}

// defaultPlugins is the [plugins] table from the host's loader options and
// limits and the engine's follow-up bounds.
func defaultPlugins() Plugins {
	lim := host.DefaultLimits()
	var loaderDefaults host.LoaderOptions // its zero value: links within followed, writable logged
	return Plugins{
		Dir:            "build/plugins",
		Watch:          false,
		CacheDir:       ".cache/wasm",
		CacheMaxMB:     256,
		FollowLinks:    !loaderDefaults.RefuseLinks,
		RefuseWritable: loaderDefaults.RefuseWritable,
		// 0: host.DefaultGuestConcurrency, twice GOMAXPROCS, decided where
		// the host runs.
		GuestConcurrency: loaderDefaults.GuestConcurrency,
		DocumentCacheMB:  engine.DefaultDocumentCacheBytes >> 20,
		Limits: Limits{
			MemoryMB:          lim.MemoryMB,
			TimeoutMS:         toMS(lim.Timeout),
			MaxOutputBytes:    int64(lim.MaxOutputBytes),
			ManifestTimeoutMS: toMS(lim.ManifestTimeout),
			Interruptible:     !lim.Uninterruptible,
			MaxTableElements:  lim.MaxTableElements,
			MaxModuleBytes:    int64(lim.MaxModuleBytes),
			CompileTimeoutMS:  toMS(lim.CompileTimeout),
			RecycleAboveMB:    lim.RecycleAboveMB,
			InstanceIdleMS:    toMS(lim.InstanceIdle),
			CodeIdleMS:        toMS(lim.CodeIdle),
			LogLinesPerSecond: lim.LogsPerSecond,
			LogBurst:          lim.LogBurst,
			MaxCascadeDepth:   engine.MaxFollowUpDepth,
			MaxFollowUps:      engine.DefaultMaxFollowUps,
			ShapeLimits: ShapeLimits{MaxFunctions: lim.MaxFunctions, MaxFunctionBytes: lim.MaxFunctionBytes,
				MaxFunctionLocals: lim.MaxFunctionLocals, MaxModuleLocals: lim.MaxModuleLocals,
				MaxNestingDepth: lim.MaxNestingDepth, MaxNestingCost: lim.MaxNestingCost},
			CallLimits: CallLimits{MaxHostCalls: lim.MaxHostCalls, MaxHostBytes: lim.MaxHostBytes, MaxReadBytes: lim.MaxReadBytes},
		},
	}
}

// defaultHTTP is the [http] table: the API's read wait and body timeout and
// the idempotency TTL from their packages, the rest set here.
func defaultHTTP() HTTP {
	return HTTP{Listen: "127.0.0.1:8080", ReadWaitMS: toMS(httpapi.DefaultReadWait),
		IdempotencyTTLSeconds: int(idempotency.DefaultTTL / time.Second),
		ReadHeaderTimeoutMS:   10000, ReadBodyTimeoutMS: toMS(httpapi.DefaultBodyTimeout),
		WriteTimeoutMS: 60000, IdleTimeoutMS: 60000, MaxHeaderBytes: 64 << 10, MaxConnections: 10000}
}

// Load reads the TOML file at path over [Default], applies the environment
// overrides and validates the result. path "" loads no file (defaults and
// environment only). A key the file sets that no setting takes is an error.
// The error joins every problem found (unknown keys and validation), one per
// line, each prefixed with path; a file that cannot be read or parsed is
// reported alone.
func Load(path string) (Config, error) {
	cfg := Default()
	var problems []error
	if path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("config: %w", err)
		}
		md, err := toml.Decode(string(data), &cfg)
		if err != nil {
			return Config{}, fmt.Errorf("config %s: %w", path, err)
		}
		for _, key := range unknownKeys(md) {
			problems = append(problems, &FieldError{Key: key, Problem: "is not a known key"})
		}
	}
	cfg.applyEnv(os.LookupEnv)
	if err := cfg.Validate(); err != nil {
		problems = append(problems, unjoin(err)...)
	}
	if len(problems) == 0 {
		return cfg, nil
	}
	if path != "" {
		for i, p := range problems {
			problems[i] = fmt.Errorf("%s: %w", path, p)
		}
	}
	return Config{}, errors.Join(problems...)
}

// unknownKeys lists the keys the file set that no field took, outermost
// only: an unknown table is reported once, not once per key inside it.
func unknownKeys(md toml.MetaData) []string {
	var out []string
	for _, k := range md.Undecoded() {
		s := k.String()
		if !slices.ContainsFunc(out, func(p string) bool { return strings.HasPrefix(s, p+".") }) {
			out = append(out, s)
		}
	}
	return out
}

// unjoin splits an errors.Join result back into its parts.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// applyEnv applies the connection-string overrides. The default database
// and broker always exist: Default creates them and a file can only replace
// them.
func (c *Config) applyEnv(lookup func(string) (string, bool)) {
	if v, ok := lookup(EnvDatabaseURL); ok && v != "" {
		db := c.Databases[DefaultName]
		db.DatabaseURI = v
		c.Databases[DefaultName] = db
		c.EventStore.DatabaseURI = v
	}
	if v, ok := lookup(EnvRedisURL); ok && v != "" {
		b := c.Brokers[DefaultName]
		b.URI = v
		c.Brokers[DefaultName] = b
	}
}

// Broker returns the broker configured under name.
func (c Config) Broker(name string) (Broker, bool) {
	b, ok := c.Brokers[name]
	return b, ok
}

// OutboxBroker returns the broker the outbox relays to (outbox.broker).
// After a successful [Config.Validate] it always exists; otherwise a missing
// broker is the zero Broker.
func (c Config) OutboxBroker() Broker {
	return c.Brokers[c.Outbox.Broker]
}

// TenantOf returns the tenant whose modules list names module.
func (c Config) TenantOf(module string) (string, bool) {
	for _, name := range sortedKeys(c.Tenants) {
		if slices.Contains(c.Tenants[name].Modules, module) {
			return name, true
		}
	}
	return "", false
}

// TenantName returns the tenant of module: the tenant whose modules list
// names it, or host.DefaultTenant ("default") when none does.
func (c Config) TenantName(module string) string {
	if name, ok := c.TenantOf(module); ok {
		return name
	}
	return host.DefaultTenant
}

// GuestSlots is the loader's guest concurrency ([plugins]
// guest_concurrency): as set, except that 0 on a config that names no
// tenant shares nothing (-1). One tenant has no one to share the cores
// with, and a cap of its own would only keep guests waiting on a load or
// a stream read from using an idle core.
func (c Config) GuestSlots() int {
	if c.Plugins.GuestConcurrency == 0 && len(c.Tenants) == 0 {
		return -1
	}
	return c.Plugins.GuestConcurrency
}

// Shares returns each tenant's share of the guest slots (weight,
// max_concurrency, calls_per_second), by tenant name.
func (c Config) Shares() map[string]host.ShareOptions {
	out := make(map[string]host.ShareOptions, len(c.Tenants))
	for name, t := range c.Tenants {
		out[name] = host.ShareOptions{Weight: t.Weight, MaxConcurrency: t.MaxConcurrency, CallsPerSecond: t.CallsPerSecond}
	}
	return out
}

// Tenancy returns the modules' tenants and the grants between tenants, as
// the host validates and enforces them.
func (c Config) Tenancy() host.Tenancy {
	g := host.Grants{Read: map[string]map[string][]string{}, Dispatch: map[string]map[string][]string{},
		Projections: map[string]map[string][]string{}}
	for name, t := range c.Tenants {
		if len(t.GrantRead) > 0 {
			g.Read[name] = t.GrantRead
		}
		if len(t.GrantDispatch) > 0 {
			g.Dispatch[name] = t.GrantDispatch
		}
		if len(t.GrantProjections) > 0 {
			g.Projections[name] = t.GrantProjections
		}
	}
	return host.Tenancy{Of: c.TenantName, Grants: g}
}

// ModuleLimits returns the sandbox limits for module: [plugins.limits] with
// its tenant's overrides applied.
func (c Config) ModuleLimits(module string) Limits {
	l := c.Plugins.Limits
	name, ok := c.TenantOf(module)
	if !ok {
		return l
	}
	t := c.Tenants[name]
	if t.MemoryMB != nil {
		l.MemoryMB = *t.MemoryMB
	}
	if t.TimeoutMS != nil {
		l.TimeoutMS = *t.TimeoutMS
	}
	if t.MaxOutputBytes != nil {
		l.MaxOutputBytes = *t.MaxOutputBytes
	}
	if t.Interruptible != nil {
		l.Interruptible = *t.Interruptible
	}
	if t.MaxTableElements != nil {
		l.MaxTableElements = *t.MaxTableElements
	}
	if t.MaxModuleBytes != nil {
		l.MaxModuleBytes = *t.MaxModuleBytes
	}
	if t.CompileTimeoutMS != nil {
		l.CompileTimeoutMS = *t.CompileTimeoutMS
	}
	if t.MaxInstances != nil {
		l.MaxInstances = *t.MaxInstances
	}
	if t.InstanceIdleMS != nil {
		l.InstanceIdleMS = *t.InstanceIdleMS
	}
	if t.CodeIdleMS != nil {
		l.CodeIdleMS = *t.CodeIdleMS
	}
	for _, f := range t.intLimits(&l) {
		if f.set != nil {
			*f.to = *f.set
		}
	}
	return l
}

func ms(v int) time.Duration          { return time.Duration(v) * time.Millisecond }
func hours(v int) time.Duration       { return time.Duration(v) * time.Hour }
func seconds(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }

// toMS and toHours are ms and hours backwards, for Default.
func toMS(d time.Duration) int    { return int(d / time.Millisecond) }
func toHours(d time.Duration) int { return int(d / time.Hour) }
