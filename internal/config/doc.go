// Package config holds the host's settings: a plain struct filled from a
// TOML file in Protean's shape, over defaults that are set in one place
// ([Default]), with environment overrides for connection strings, and a
// [Config.Validate] whose messages name the TOML key at fault.
//
// [Load] is the whole sequence: defaults, then the file, then the
// environment (PROTEAN_DATABASE_URL, PROTEAN_REDIS_URL), then validation.
// A key the file sets that no field takes is an error, so a typo such as
// lease_ttl instead of lease_ttl_ms fails at start instead of silently
// keeping the default. Every problem is reported, one per line (errors.Join),
// so an operator can fix a file in one pass.
//
// Sections:
//
//	[databases.NAME]          provider = "memory" | "postgresql", database_uri
//	[event_store]             provider = "memory" | "message_db", database_uri
//	[brokers.NAME]            provider = "inline" | "redis" | ..., uri, key_prefix
//	[outbox]                  broker, batching, retry/backoff, lock, retention
//	[server.partitioning]     lease_ttl_ms, heartbeat_interval_seconds, poll_interval_seconds, reap_idle_ms, ack_delay_ms,
//	                          warn_live_partitions
//	[server.priority_lanes]   enabled, threshold, backfill_suffix
//	[server.stream_subscription]  max_retries, retry_delay_seconds, max_retry_delay_seconds
//	[server]                  default_subscription_type = "stream" | "event_store" (unset: event_store with
//	                          PostgreSQL stores and the inline broker, stream otherwise; Config.SubscriptionType)
//	[server.event_store_subscription]  batch_size, poll_interval_ms, gap_timeout_ms, key_workers
//	[plugins]                 dir, watch, cache_dir, cache_max_mb, allow_repartition, follow_links, refuse_writable,
//	                          guest_concurrency (guest calls at once, host-wide, shared by tenant weight; 0: 2 x GOMAXPROCS
//	                          with [tenants], none shared without)
//	[plugins.limits]          memory_mb, timeout_ms, max_output_bytes, manifest_timeout_ms, interruptible,
//	                          max_table_elements, max_module_bytes, compile_timeout_ms, recycle_above_mb,
//	                          log_lines_per_second, log_burst, max_cascade_depth, max_follow_ups, max_instances,
//	                          instance_idle_ms (an instance idle this long is closed; 0 keeps them),
//	                          code_idle_ms (a module with no instance and no call this long gives back its
//	                          compiled code, compiled again from cache_dir at the next call; 0 keeps it),
//	                          max_functions, max_function_bytes, max_function_locals, max_module_locals,
//	                          max_nesting_depth, max_nesting_cost (a module's shape, checked before compiling),
//	                          max_host_calls, max_host_bytes, max_read_bytes (what the host does for one call)
//	[tenants.NAME]            modules (file names without .wasm), memory_mb / timeout_ms / max_output_bytes / interruptible /
//	                          max_table_elements / max_module_bytes / compile_timeout_ms / max_instances /
//	                          instance_idle_ms / code_idle_ms overrides,
//	                          the six shape limits (max_functions ... max_nesting_cost) and the three call limits,
//	                          weight (share of guest_concurrency, 0: 1), max_concurrency (guest calls at once over all
//	                          its modules, 0: half of guest_concurrency), calls_per_second (0: none),
//	                          grant_read = { READER = ["category", ...] }, grant_dispatch = { READER = ["CommandType", ...] }
//	[http]                    listen, read_wait_ms, idempotency_ttl_seconds, read_header_timeout_ms,
//	                          read_body_timeout_ms, write_timeout_ms (> read_wait_ms and read_body_timeout_ms),
//	                          idle_timeout_ms, max_header_bytes, max_connections
//	[http.auth]               allow_unauthenticated (serve a non-loopback listen address with no keys);
//	                          [[http.auth.keys]] tenant, role (read, write, operator, deployer, admin),
//	                          sha256 (of the key; protean-host keys new prints the lines)
//	[http.auth.oidc]          issuer, audience, jwks_url (https; fetched again on an unknown kid) or jwks_file,
//	                          permissions_claim ("permissions": ["TENANT:ROLE", "*:admin"]),
//	                          clock_skew_seconds (0..300; 0 means 60, on exp; nbf allows 5 minutes)
//
// Defaults (generated from Default, which reads them from the packages that
// own them: relay.DefaultOptions, broker.DefaultOptions,
// partition.DefaultConsumerOptions, host.DefaultLimits; a test keeps this
// list in step):
//
//	brokers.default.key_prefix = ""
//	brokers.default.provider = "inline"
//	brokers.default.uri = ""
//	databases.default.database_uri = ""
//	databases.default.provider = "memory"
//	event_store.database_uri = ""
//	event_store.provider = "memory"
//	http.admin_listen = ""
//	http.auth.allow_unauthenticated = false
//	http.auth.keys = []
//	http.auth.oidc.audience = ""
//	http.auth.oidc.clock_skew_seconds = 0
//	http.auth.oidc.issuer = ""
//	http.auth.oidc.jwks_file = ""
//	http.auth.oidc.jwks_url = ""
//	http.auth.oidc.permissions_claim = ""
//	http.idempotency_ttl_seconds = 86400
//	http.idle_timeout_ms = 60000
//	http.listen = "127.0.0.1:8080"
//	http.max_connections = 10000
//	http.max_header_bytes = 65536
//	http.pprof = false
//	http.read_body_timeout_ms = 30000
//	http.read_header_timeout_ms = 10000
//	http.read_wait_ms = 5000
//	http.write_timeout_ms = 60000
//	outbox.abandoned_retention_hours = 720
//	outbox.backoff_jitter = 0.1
//	outbox.base_retry_delay_ms = 1000
//	outbox.broker = "default"
//	outbox.lock_timeout_ms = 15000
//	outbox.max_retries = 3
//	outbox.max_retry_delay_ms = 60000
//	outbox.messages_per_tick = 50
//	outbox.published_retention_hours = 168
//	outbox.relay_lease_ms = 5000
//	outbox.restart_republish_seconds = 60
//	outbox.tick_interval_ms = 10
//	plugins.allow_repartition = false
//	plugins.cache_dir = ".cache/wasm"
//	plugins.cache_max_mb = 256
//	plugins.dir = "build/plugins"
//	plugins.document_cache_mb = 16
//	plugins.follow_links = true
//	plugins.guest_concurrency = 0
//	plugins.limits.code_idle_ms = 0
//	plugins.limits.compile_timeout_ms = 10000
//	plugins.limits.instance_idle_ms = 60000
//	plugins.limits.interruptible = true
//	plugins.limits.log_burst = 100
//	plugins.limits.log_lines_per_second = 10
//	plugins.limits.manifest_timeout_ms = 2000
//	plugins.limits.max_cascade_depth = 16
//	plugins.limits.max_follow_ups = 256
//	plugins.limits.max_function_bytes = 1048576
//	plugins.limits.max_function_locals = 50000
//	plugins.limits.max_functions = 100000
//	plugins.limits.max_host_bytes = 67108864
//	plugins.limits.max_host_calls = 10000
//	plugins.limits.max_instances = 0
//	plugins.limits.max_module_bytes = 33554432
//	plugins.limits.max_module_locals = 1000000
//	plugins.limits.max_nesting_cost = 100000000
//	plugins.limits.max_nesting_depth = 8192
//	plugins.limits.max_output_bytes = 16777216
//	plugins.limits.max_read_bytes = 1048576
//	plugins.limits.max_table_elements = 100000
//	plugins.limits.memory_mb = 64
//	plugins.limits.recycle_above_mb = 32
//	plugins.limits.timeout_ms = 5000
//	plugins.refuse_writable = false
//	plugins.watch = false
//	server.default_subscription_type = ""
//	server.event_store_subscription.batch_size = 100
//	server.event_store_subscription.gap_timeout_ms = 5000
//	server.event_store_subscription.key_workers = 2
//	server.event_store_subscription.poll_interval_ms = 100
//	server.partitioning.ack_delay_ms = 500
//	server.partitioning.heartbeat_interval_seconds = (unset)
//	server.partitioning.lease_ttl_ms = 15000
//	server.partitioning.poll_interval_seconds = 10
//	server.partitioning.reap_idle_ms = 3600000
//	server.partitioning.warn_live_partitions = 1000
//	server.priority_lanes.backfill_suffix = "backfill"
//	server.priority_lanes.enabled = false
//	server.priority_lanes.threshold = 0
//	server.stream_subscription.max_retries = 3
//	server.stream_subscription.max_retry_delay_seconds = 60
//	server.stream_subscription.retry_delay_seconds = 1
//	telemetry.endpoint = ""
//	telemetry.sample_ratio = 0
//	telemetry.service_name = ""
//	telemetry.tracing = false
//
// End of defaults.
//
// The compiled-code cache (plugins.cache_dir) grows by a module's compiled
// size (~16 MB for a Go module) at each new version. cache_max_mb bounds
// it: the host records, in protean-cache-index.json there, the files each
// module's compile wrote, and after a compile that wrote something deletes
// the least recently used modules' files until the directory fits. It
// keeps the modules loaded, the one just compiled and the Extism kernel
// (compiled at start, before any module), even past the bound; a restart
// on the modules it ran compiles nothing. A file the index does not name
// (written before it existed, by another wazero version, or by another
// host sharing the directory between our compiles) is never deleted.
// Compiles are serialized while the bound is on. Set it above what one
// plugins directory compiles to (with room for a new version): a module not
// yet loaded at a start counts as unused, so a smaller bound makes the
// modules of one directory evict each other. 0 leaves the directory
// unbounded.
//
// Each load also writes the module's manifest memo there
// (protean-manifests/): a start or reload that finds it compiles nothing
// and serves at once, compiling the code in the background or at its
// first call (see package host, memo.go).
//
// Relative paths (plugins.dir, plugins.cache_dir) are used as written, that
// is relative to the working directory of the process, not to the config
// file: `make run` runs from the repository root with configs/domain.toml
// saying dir = "build/plugins". Use absolute paths in deployments that start
// the host elsewhere.
//
// Plugin files: only regular files named *.wasm are read from plugins.dir,
// never more of one than max_module_bytes. A symbolic link out of the
// directory is refused; follow_links decides about one that stays within.
// A plugins directory, module file or config file that users other than
// its owner and group may write is logged at start and at each reload, or
// refused with refuse_writable (group-writable is not: a deploy group or a
// Kubernetes fsGroup makes it so on purpose).
//
// Tables keyed by a name (databases, brokers, tenants) are replaced entry by
// entry: a file that writes [brokers.default] replaces the whole default
// broker, so it must state provider. Entries the file does not mention keep
// their defaults; there is always a databases.default and a brokers.default.
//
// Broker providers other than inline and redis are accepted here: the host
// rejects them where it builds brokers and checks `sequential_by`, with a
// reason that names the broker and the categories that need partitioning.
//
// Tenants: a module belongs to the tenant whose modules list names it, or
// to the tenant "default" when none does ([tenants.default] may set its
// limits and grants). A tenant owns the categories its modules write; the
// owner grants other tenants read of a category (grant_read: their
// handlers may subscribe to it, their modules load its aggregates and read
// its streams, never write) or the dispatch of a command type
// (grant_dispatch). The reader does not ask; only the owner's table
// counts. No key names a category's owner: when two tenants claim one, a
// reload keeps it with the tenant that runs it (docs/operations.md,
// "Deploys per tenant"). See host.ValidateTenants.
//
// Times are plain numbers whose unit is in the key name (_ms, _seconds,
// _hours), as in Protean; the methods on each section convert them to
// time.Duration so callers never multiply by hand.
package config
