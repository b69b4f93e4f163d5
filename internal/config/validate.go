package config

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/proteanhq/protean-host/internal/auth"
	"github.com/proteanhq/protean-host/internal/host"
)

// FieldError is one problem with one setting. Key is the dotted TOML key
// (server.partitioning.lease_ttl_ms); Error reads "{Key} {Problem}".
type FieldError struct {
	Key     string
	Problem string
}

func (e *FieldError) Error() string { return e.Key + " " + e.Problem }

// maxWasmMemoryMB is the wasm32 address space: 65536 pages of 64 KiB.
const maxWasmMemoryMB = 4096

// Bounds of the retry policy: a poison message holds its key for at most
// about maxRetries × maxRetryDelaySeconds before it halts or is parked.
const (
	maxRetries           = 1000
	maxRetryDelaySeconds = 3600
)

// Largest values that still fit a time.Duration in their unit.
const (
	maxMS      = math.MaxInt64 / int64(time.Millisecond)
	maxHours   = math.MaxInt64 / int64(time.Hour)
	maxSeconds = float64(math.MaxInt64 / int64(time.Second))
)

// Validate reports every problem with c, joined with errors.Join (one
// [*FieldError] per line), or nil. Connection strings are never echoed in a
// message: they may hold passwords.
func (c Config) Validate() error {
	v := &validator{}
	v.databases(c.Databases)
	v.eventStore(c.EventStore)
	v.brokers(c.Brokers)
	v.outbox(c)
	v.partitioning(c.Server.Partitioning)
	v.lanes(c.Server.PriorityLanes)
	v.subscriptions(c.Server)
	v.plugins(c.Plugins)
	v.tenants(c.Tenants)
	v.http(c.HTTP)
	v.httpAuth(c)
	v.telemetry(c.Telemetry)
	return errors.Join(v.errs...)
}

// telemetry checks the [telemetry] table: an http(s) endpoint URL, and a
// sample ratio in [0, 1].
func (v *validator) telemetry(t Telemetry) {
	if t.Endpoint != "" {
		u, err := url.Parse(t.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			v.add("telemetry.endpoint", "must be an http:// or https:// URL, such as http://collector:4318/v1/traces (got %q)", t.Endpoint)
		}
	}
	if t.SampleRatio < 0 || t.SampleRatio > 1 || math.IsNaN(t.SampleRatio) {
		v.add("telemetry.sample_ratio", "must be within [0, 1] (got %v)", t.SampleRatio)
	}
}

// databases checks the [databases] tables: a known provider, and a URI for
// PostgreSQL.
func (v *validator) databases(dbs map[string]Database) {
	for _, name := range sortedKeys(dbs) {
		db := dbs[name]
		key := "databases." + name
		switch db.Provider {
		case ProviderMemory:
		case ProviderPostgreSQL:
			if db.DatabaseURI == "" {
				hint := ""
				if name == DefaultName {
					hint = " (or set " + EnvDatabaseURL + ")"
				}
				v.add(key+".database_uri", "is required when provider = %q%s", ProviderPostgreSQL, hint)
			}
		default:
			v.provider(key+".provider", db.Provider, ProviderMemory, ProviderPostgreSQL)
		}
	}
}

// eventStore checks the [event_store] table: a known provider, and a URI for
// Message DB.
func (v *validator) eventStore(es EventStore) {
	switch es.Provider {
	case ProviderMemory:
	case ProviderMessageDB:
		if es.DatabaseURI == "" {
			v.add("event_store.database_uri", "is required when provider = %q (or set %s)", ProviderMessageDB, EnvDatabaseURL)
		}
	default:
		v.provider("event_store.provider", es.Provider, ProviderMemory, ProviderMessageDB)
	}
}

// brokers checks the [brokers] tables: a provider, and a usable URI for Redis.
func (v *validator) brokers(brokers map[string]Broker) {
	for _, name := range sortedKeys(brokers) {
		b := brokers[name]
		key := "brokers." + name
		switch b.Provider {
		case "":
			v.add(key+".provider", "is required (%s | %s)", ProviderInline, ProviderRedis)
		case ProviderRedis:
			v.redisURI(key+".uri", b.URI, name == DefaultName)
		}
		// Other providers are the host's to reject, naming what needs them.
	}
}

// subscriptions checks the stream subscription's retry policy, the default
// subscription type and the event-store subscription, in that order.
func (v *validator) subscriptions(s Server) {
	ss := s.StreamSubscription
	if ss.MaxRetries < 0 || ss.MaxRetries > maxRetries {
		v.add("server.stream_subscription.max_retries", "must be between 0 and %d (retries after the first attempt; got %d)", maxRetries, ss.MaxRetries)
	}
	okDelay := v.seconds("server.stream_subscription.retry_delay_seconds", ss.RetryDelaySeconds, true)
	okMax := v.seconds("server.stream_subscription.max_retry_delay_seconds", ss.MaxRetryDelaySeconds, false)
	if okMax && ss.MaxRetryDelaySeconds > maxRetryDelaySeconds {
		v.add("server.stream_subscription.max_retry_delay_seconds", "must be <= %d (got %v)", maxRetryDelaySeconds, ss.MaxRetryDelaySeconds)
	}
	if okDelay && okMax && ss.MaxRetryDelaySeconds < ss.RetryDelaySeconds {
		v.add("server.stream_subscription.max_retry_delay_seconds", "must be >= server.stream_subscription.retry_delay_seconds (got %v < %v)",
			ss.MaxRetryDelaySeconds, ss.RetryDelaySeconds)
	}
	switch s.DefaultSubscriptionType {
	case "", SubscriptionStream, SubscriptionEventStore:
	default:
		v.add("server.default_subscription_type", "%q: want %q or %q (or unset: %s with PostgreSQL and the inline broker, %s otherwise)",
			s.DefaultSubscriptionType, SubscriptionStream, SubscriptionEventStore, SubscriptionEventStore, SubscriptionStream)
	}
	es := s.EventStoreSubscription
	v.positive("server.event_store_subscription.batch_size", es.BatchSize)
	v.positive("server.event_store_subscription.key_workers", es.KeyWorkers)
	v.ms("server.event_store_subscription.poll_interval_ms", es.PollIntervalMS, false)
	v.ms("server.event_store_subscription.gap_timeout_ms", es.GapTimeoutMS, false)
}

// plugins checks the [plugins] table and its host-wide [plugins.limits].
func (v *validator) plugins(p Plugins) {
	if p.Dir == "" {
		v.add("plugins.dir", "must not be empty")
	}
	if p.CacheMaxMB < 0 {
		v.add("plugins.cache_max_mb", "must be >= 0 (got %d; 0 is unbounded)", p.CacheMaxMB)
	}
	if p.DocumentCacheMB < 0 {
		v.add("plugins.document_cache_mb", "must be >= 0 (got %d; 0 keeps no cache)", p.DocumentCacheMB)
	}
	if p.GuestConcurrency < -1 {
		v.add("plugins.guest_concurrency", "must be >= -1 (got %d; 0 means twice GOMAXPROCS, -1 shares nothing)", p.GuestConcurrency)
	}
	l := p.Limits
	v.memoryMB("plugins.limits.memory_mb", l.MemoryMB)
	v.ms("plugins.limits.timeout_ms", l.TimeoutMS, false)
	v.bytes("plugins.limits.max_output_bytes", l.MaxOutputBytes)
	v.ms("plugins.limits.manifest_timeout_ms", l.ManifestTimeoutMS, false)
	v.positive("plugins.limits.max_table_elements", l.MaxTableElements)
	v.bytes("plugins.limits.max_module_bytes", l.MaxModuleBytes)
	v.ms("plugins.limits.compile_timeout_ms", l.CompileTimeoutMS, false)
	v.positive("plugins.limits.recycle_above_mb", l.RecycleAboveMB)
	v.positive("plugins.limits.log_lines_per_second", l.LogLinesPerSecond)
	v.positive("plugins.limits.log_burst", l.LogBurst)
	v.positive("plugins.limits.max_cascade_depth", l.MaxCascadeDepth)
	v.positive("plugins.limits.max_follow_ups", l.MaxFollowUps)
	for _, f := range (&Tenant{}).intLimits(&l) {
		v.positive("plugins.limits."+f.key, *f.to)
	}
	if l.MaxInstances < 0 {
		v.add("plugins.limits.max_instances", "must be >= 0 (got %d; 0 means GOMAXPROCS)", l.MaxInstances)
	}
	v.ms("plugins.limits.instance_idle_ms", l.InstanceIdleMS, true)
	v.ms("plugins.limits.code_idle_ms", l.CodeIdleMS, true)
}

// address checks a listen address, host:port.
func (v *validator) address(key, addr, example string) {
	if _, port, err := net.SplitHostPort(addr); err != nil {
		v.add(key, "must be host:port, e.g. %s (got %q)", example, addr)
	} else if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		v.add(key, "has a bad port %q (want 0..65535)", port)
	}
}

// http checks the [http] table. The write timeout runs from the end of a
// request's header to the end of its answer, so it must outlast a
// ?min_position wait and a body's reading.
func (v *validator) http(h HTTP) {
	okWait := v.ms("http.read_wait_ms", h.ReadWaitMS, false)
	v.positive("http.idempotency_ttl_seconds", h.IdempotencyTTLSeconds)
	v.address("http.listen", h.Listen, "127.0.0.1:8080")
	if h.AdminListen != "" {
		v.address("http.admin_listen", h.AdminListen, "127.0.0.1:9070")
		if h.AdminListen == h.Listen {
			v.add("http.admin_listen", "must differ from http.listen (%q): leave it out to serve the admin routes there", h.Listen)
		}
	}
	v.ms("http.read_header_timeout_ms", h.ReadHeaderTimeoutMS, false)
	okBody := v.ms("http.read_body_timeout_ms", h.ReadBodyTimeoutMS, false)
	v.ms("http.idle_timeout_ms", h.IdleTimeoutMS, false)
	if v.ms("http.write_timeout_ms", h.WriteTimeoutMS, false) {
		if okWait && h.WriteTimeoutMS <= h.ReadWaitMS {
			v.add("http.write_timeout_ms", "must be > http.read_wait_ms, or it cuts a ?min_position wait (got %d <= %d)", h.WriteTimeoutMS, h.ReadWaitMS)
		}
		if okBody && h.WriteTimeoutMS <= h.ReadBodyTimeoutMS {
			v.add("http.write_timeout_ms", "must be > http.read_body_timeout_ms, or it cuts a command whose body came in time (got %d <= %d)",
				h.WriteTimeoutMS, h.ReadBodyTimeoutMS)
		}
	}
	v.positive("http.max_header_bytes", h.MaxHeaderBytes)
	v.positive("http.max_connections", h.MaxConnections)
}

// httpAuth checks [http.auth]: every key well formed (auth.NewKeys), of a
// tenant the config knows.
func (v *validator) httpAuth(c Config) {
	if _, err := auth.NewKeys(c.HTTP.Auth.AuthKeys()); err != nil {
		v.add("http.auth.keys", "%v", err)
	}
	if o := c.HTTP.Auth.OIDC; o.Enabled() {
		if o.Issuer == "" {
			v.add("http.auth.oidc.issuer", "must be set (the tokens' iss)")
		}
		if o.Audience == "" {
			v.add("http.auth.oidc.audience", "must be set (one of the tokens' aud)")
		}
		if (o.JWKSURL == "") == (o.JWKSFile == "") {
			v.add("http.auth.oidc", "set exactly one of jwks_url and jwks_file")
		}
		if u, err := url.Parse(o.JWKSURL); o.JWKSURL != "" && (err != nil || (u.Scheme != "https" && !(u.Scheme == "http" && loopback(u.Hostname())))) {
			v.add("http.auth.oidc.jwks_url", "must be an https URL (http only on loopback; got %q)", o.JWKSURL)
		}
		if o.ClockSkewSeconds < 0 || o.ClockSkewSeconds > 300 {
			v.add("http.auth.oidc.clock_skew_seconds", "must be 0..300 (got %v; 0 means %s)", o.ClockSkewSeconds, auth.DefaultSkew)
		}
	}
	for i, k := range c.HTTP.Auth.Keys {
		if _, ok := c.Tenants[k.Tenant]; k.Tenant != "" && k.Tenant != host.DefaultTenant && !ok {
			v.add("http.auth.keys", "key %d: tenant %q is not configured (add [tenants.%s], or use %q)", i, k.Tenant, k.Tenant, host.DefaultTenant)
		}
	}
}

func (v *validator) outbox(c Config) {
	o := c.Outbox
	switch _, ok := c.Brokers[o.Broker]; {
	case o.Broker == "":
		v.add("outbox.broker", "must not be empty")
	case !ok:
		v.add("outbox.broker", "names %q, which is not a configured broker (have: %s)",
			o.Broker, strings.Join(sortedKeys(c.Brokers), ", "))
	}
	v.positive("outbox.messages_per_tick", o.MessagesPerTick)
	v.ms("outbox.tick_interval_ms", o.TickIntervalMS, false)
	v.positive("outbox.max_retries", o.MaxRetries)
	v.ms("outbox.base_retry_delay_ms", o.BaseRetryDelayMS, false)
	if v.ms("outbox.max_retry_delay_ms", o.MaxRetryDelayMS, false) && o.BaseRetryDelayMS > 0 &&
		o.MaxRetryDelayMS < o.BaseRetryDelayMS {
		v.add("outbox.max_retry_delay_ms", "must be >= outbox.base_retry_delay_ms (got %d < %d)",
			o.MaxRetryDelayMS, o.BaseRetryDelayMS)
	}
	if !(o.BackoffJitter >= 0 && o.BackoffJitter <= 1) { // also catches NaN
		v.add("outbox.backoff_jitter", "must be between 0 and 1 (got %v)", o.BackoffJitter)
	}
	v.ms("outbox.lock_timeout_ms", o.LockTimeoutMS, false)
	if v.ms("outbox.relay_lease_ms", o.RelayLeaseMS, true) && o.RelayLeaseMS > 0 && o.RelayLeaseMS < minRelayLeaseMS {
		v.add("outbox.relay_lease_ms", "must be 0 (no lease: every relay claims) or at least %d (got %d)", minRelayLeaseMS, o.RelayLeaseMS)
	}
	v.hours("outbox.published_retention_hours", o.PublishedRetentionHours)
	v.hours("outbox.abandoned_retention_hours", o.AbandonedRetentionHours)
	switch rs := o.RestartRepublishSeconds; {
	case rs < 0:
		v.add("outbox.restart_republish_seconds", "must be >= 0, 0 republishes nothing after a restart (got %d)", rs)
	case rs > 86400:
		v.add("outbox.restart_republish_seconds", "must be <= 86400 (got %d)", rs)
	case o.PublishedRetentionHours > 0 && int64(o.PublishedRetentionHours) <= maxHours && int64(rs) > int64(o.PublishedRetentionHours)*3600:
		v.add("outbox.restart_republish_seconds", "must be within outbox.published_retention_hours (got %d s > %d h): older rows are gone",
			rs, o.PublishedRetentionHours)
	}
}

func (v *validator) partitioning(p Partitioning) {
	const pre = "server.partitioning."
	ttlOK := v.ms(pre+"lease_ttl_ms", p.LeaseTTLMS, false)
	if hb := p.HeartbeatIntervalSeconds; hb != nil {
		if v.seconds(pre+"heartbeat_interval_seconds", *hb, false) && ttlOK && p.HeartbeatInterval() >= p.LeaseTTL() {
			v.add(pre+"heartbeat_interval_seconds", "must be < %slease_ttl_ms (got %v >= %v)",
				pre, p.HeartbeatInterval(), p.LeaseTTL())
		}
	} // unset: derived as lease_ttl_ms/5000 s, always > 0 and < the TTL
	v.seconds(pre+"poll_interval_seconds", p.PollIntervalSeconds, false)
	v.ms(pre+"reap_idle_ms", p.ReapIdleMS, true)
	v.ms(pre+"ack_delay_ms", p.AckDelayMS, true)
	if p.WarnLivePartitions < 0 {
		v.add(pre+"warn_live_partitions", "must be >= 0, 0 turns the warning off (got %d)", p.WarnLivePartitions)
	}
}

// lanes checks the backfill suffix with the rules a partition key must pass
// where they apply to a lane name: it becomes the last segment of
// {category}:{key}:{suffix}, so a colon would make it ambiguous, "dlq" would
// share the DLQ lane, and the __name__ form is the sentinel namespace.
func (v *validator) lanes(l PriorityLanes) {
	const key = "server.priority_lanes.backfill_suffix"
	s := l.BackfillSuffix
	switch {
	case s == "":
		v.add(key, "must not be empty")
	case strings.Contains(s, ":"):
		v.add(key, "must not contain a colon (got %q)", s)
	case s == "dlq":
		v.add(key, `must not be "dlq", the DLQ lane`)
	case len(s) >= 4 && strings.HasPrefix(s, "__") && strings.HasSuffix(s, "__"):
		v.add(key, "must not use the reserved '__name__' sentinel form (got %q)", s)
	}
}

func (v *validator) tenants(tenants map[string]Tenant) {
	owner := map[string]string{} // module -> tenant
	for _, name := range sortedKeys(tenants) {
		t := tenants[name]
		pre := "tenants." + name + "."
		if t.MemoryMB != nil {
			v.memoryMB(pre+"memory_mb", *t.MemoryMB)
		}
		if t.TimeoutMS != nil {
			v.ms(pre+"timeout_ms", *t.TimeoutMS, false)
		}
		if t.MaxOutputBytes != nil {
			v.bytes(pre+"max_output_bytes", *t.MaxOutputBytes)
		}
		if t.MaxTableElements != nil {
			v.positive(pre+"max_table_elements", *t.MaxTableElements)
		}
		if t.MaxModuleBytes != nil {
			v.bytes(pre+"max_module_bytes", *t.MaxModuleBytes)
		}
		if t.CompileTimeoutMS != nil {
			v.ms(pre+"compile_timeout_ms", *t.CompileTimeoutMS, false)
		}
		if t.MaxInstances != nil {
			v.positive(pre+"max_instances", *t.MaxInstances)
		}
		if t.InstanceIdleMS != nil {
			v.ms(pre+"instance_idle_ms", *t.InstanceIdleMS, true)
		}
		if t.CodeIdleMS != nil {
			v.ms(pre+"code_idle_ms", *t.CodeIdleMS, true)
		}
		for _, f := range t.intLimits(&Limits{}) {
			if f.set != nil {
				v.positive(pre+f.key, *f.set)
			}
		}
		if t.Weight < 0 {
			v.add(pre+"weight", "must be >= 0 (got %d; 0 means 1)", t.Weight)
		}
		if t.MaxConcurrency < 0 {
			v.add(pre+"max_concurrency", "must be >= 0 (got %d; 0 means half of plugins.guest_concurrency)", t.MaxConcurrency)
		}
		if t.CallsPerSecond < 0 || math.IsNaN(t.CallsPerSecond) || math.IsInf(t.CallsPerSecond, 0) {
			v.add(pre+"calls_per_second", "must be a number >= 0 (got %v; 0 means no limit)", t.CallsPerSecond)
		}
		v.grants(tenants, name, pre+"grant_read", t.GrantRead)
		v.grants(tenants, name, pre+"grant_dispatch", t.GrantDispatch)
		v.grants(tenants, name, pre+"grant_projections", t.GrantProjections)
		for i, m := range t.Modules {
			switch prev, taken := owner[m]; {
			case m == "":
				v.add(fmt.Sprintf("%smodules[%d]", pre, i), "must not be empty")
			case taken && prev == name:
				v.add(pre+"modules", "lists %q twice", m)
			case taken:
				v.add(pre+"modules", "lists %q, which already belongs to tenants.%s", m, prev)
			default:
				owner[m] = name
			}
		}
	}
}

// grants checks one grant table: every reader is a tenant (a [tenants]
// entry, or host.DefaultTenant), not the granting one, and every name is
// non-empty.
func (v *validator) grants(tenants map[string]Tenant, owner, key string, g map[string][]string) {
	for _, reader := range sortedKeys(g) {
		_, known := tenants[reader]
		switch {
		case reader == owner:
			v.add(key+"."+reader, "grants tenant %s to itself (a tenant always has what it owns)", reader)
		case !known && reader != host.DefaultTenant:
			v.add(key+"."+reader, "names tenant %s, which is not a [tenants.%s] table (nor %q, the tenant of unlisted modules)", reader, reader, host.DefaultTenant)
		}
		for i, n := range g[reader] {
			if n == "" {
				v.add(fmt.Sprintf("%s.%s[%d]", key, reader, i), "must not be empty")
			}
		}
	}
}

type validator struct{ errs []error }

func (v *validator) add(key, format string, args ...any) {
	v.errs = append(v.errs, &FieldError{Key: key, Problem: fmt.Sprintf(format, args...)})
}

func (v *validator) provider(key, got string, want ...string) {
	if got == "" {
		v.add(key, "is required (%s)", strings.Join(want, " | "))
		return
	}
	quoted := make([]string, len(want))
	for i, w := range want {
		quoted[i] = strconv.Quote(w)
	}
	v.add(key, "must be %s (got %q)", strings.Join(quoted, " or "), got)
}

func (v *validator) redisURI(key, uri string, isDefault bool) {
	if uri == "" {
		hint := ""
		if isDefault {
			hint = " (or set " + EnvRedisURL + ")"
		}
		v.add(key, "is required when provider = %q%s", ProviderRedis, hint)
		return
	}
	u, err := url.Parse(uri)
	if err != nil {
		v.add(key, "is not a valid URL") // the text may hold a password; not echoed
		return
	}
	switch u.Scheme {
	case "redis", "rediss", "unix":
	default:
		v.add(key, "must be a redis://, rediss:// or unix:// URL (got scheme %q)", u.Scheme)
	}
}

func (v *validator) positive(key string, n int) bool {
	if n <= 0 {
		v.add(key, "must be > 0 (got %d)", n)
		return false
	}
	return true
}

// minRelayLeaseMS is the shortest relay lease: its holder renews it every
// third of it, over a round trip to the database.
const minRelayLeaseMS = 100

// ms checks a millisecond count: > 0 (or >= 0 with zeroOK) and small enough
// for a time.Duration.
func (v *validator) ms(key string, n int, zeroOK bool) bool {
	switch {
	case zeroOK && n < 0:
		v.add(key, "must be >= 0 (got %d)", n)
	case !zeroOK && n <= 0:
		v.add(key, "must be > 0 (got %d)", n)
	case int64(n) > maxMS:
		v.add(key, "must be <= %d (got %d)", maxMS, n)
	default:
		return true
	}
	return false
}

// hours checks a retention in hours, where 0 means keep forever.
func (v *validator) hours(key string, n int) {
	switch {
	case n < 0:
		v.add(key, "must be >= 0, 0 keeps rows forever (got %d)", n)
	case int64(n) > maxHours:
		v.add(key, "must be <= %d (got %d)", maxHours, n)
	}
}

// seconds checks a (possibly fractional) number of seconds. TOML allows
// nan and inf; both are rejected.
func (v *validator) seconds(key string, s float64, zeroOK bool) bool {
	switch {
	case math.IsNaN(s) || math.IsInf(s, 0):
		v.add(key, "must be a finite number (got %v)", s)
	case zeroOK && s < 0:
		v.add(key, "must be >= 0 (got %v)", s)
	case !zeroOK && s <= 0:
		v.add(key, "must be > 0 (got %v)", s)
	case s > maxSeconds:
		v.add(key, "must be <= %v (got %v)", maxSeconds, s)
	default:
		return true
	}
	return false
}

func (v *validator) memoryMB(key string, n int) {
	if n <= 0 || n > maxWasmMemoryMB {
		v.add(key, "must be between 1 and %d, the wasm32 address space (got %d)", maxWasmMemoryMB, n)
	}
}

func (v *validator) bytes(key string, n int64) {
	if n <= 0 {
		v.add(key, "must be > 0 (got %d)", n)
	}
}

func sortedKeys[M ~map[string]V, V any](m M) []string {
	return slices.Sorted(maps.Keys(m))
}
