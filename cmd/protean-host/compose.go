package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/auth"
	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/engine"
	"github.com/proteanhq/protean-host/internal/groups"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/httpapi"
	"github.com/proteanhq/protean-host/internal/ops"
	"github.com/proteanhq/protean-host/internal/ops/local"
	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/redisstream"
	"github.com/proteanhq/protean-host/internal/relay"
	"github.com/proteanhq/protean-host/internal/routes"
	"github.com/proteanhq/protean-host/internal/telemetry"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

// The composition root: start builds the host's components here, each
// from the ones it depends on, in that order, so no component is bound to
// another after it is built. The running routes (package routes) are the
// one value a reload swaps for all of them: the unit of work's keys, the
// relay's partitions, the consumer groups of every delivery source.

// composition is what the components are built from.
type composition struct {
	cfg       config.Config
	st        *stores
	br        *openedBroker
	set       *host.Set
	log       *slog.Logger
	clk       clock.Clock
	owner     string
	reg       *prometheus.Registry
	fromStore bool // the handlers read the event store (config.SubscriptionEventStore)
	started   time.Time
}

// partitioned says the partition workers deliver the partitioned
// categories: a Redis broker, and the handlers read it.
func (c *composition) partitioned() bool { return c.br.redis != nil && !c.fromStore }

// loadPlugins loads and validates the plugins directory.
func (h *hostProcess) loadPlugins(ctx context.Context, e *env) (*host.Loader, *host.Set, error) {
	loader, err := e.loader(nil, true)
	if err != nil {
		return nil, nil, err
	}
	h.closers = append(h.closers, func() error {
		if h.guestsRunning {
			return nil
		}
		return loader.Close(context.Background())
	})
	dir := e.cfg.Plugins.Dir
	set, errs := host.LoadSet(ctx, loader, dir, e.broker())
	if ctx.Err() != nil { // SIGINT or SIGTERM while loading
		if set != nil {
			_ = set.Close(context.Background())
		}
		return nil, nil, fmt.Errorf("loading %s: %w; nothing started", dir, context.Cause(ctx))
	}
	if len(errs) > 0 {
		for _, err := range errs {
			fmt.Fprintln(e.stderr, err)
		}
		return nil, nil, fmt.Errorf("%d problem(s) in %s; nothing started", len(errs), dir)
	}
	// The set is closed here only if the engine never took it: the engine
	// closes what it owns.
	h.closers = append(h.closers, func() error {
		if h.eng != nil {
			return nil
		}
		return set.Close(context.Background())
	})
	e.log.Info("plugins loaded", "dir", dir, "modules", len(set.Modules()), "partitioned_categories", len(set.Keys()))
	return loader, set, nil
}

// compose builds the components: the routes, the relay, the unit of work,
// the engine, the delivery sources, the reloader.
func (h *hostProcess) compose(c *composition, loader *host.Loader, b host.Broker) error {
	cfg, st := c.cfg, c.st
	c.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	infra := delivery.NewMetrics(c.reg)
	h.routes = routes.New(c.set, c.partitioned())
	c.log.Info("delivery", "subscription_type", cfg.SubscriptionType(), "broker", cfg.OutboxBroker().Provider)
	h.relay = newRelay(c, infra, h.routes)
	c.reg.MustRegister(newOutboxCollector(st.outbox, c.log), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "protean_outbox_relay_leading",
		Help:        "1 while this host's outbox relay claims its broker's rows (it holds the broker's relay lease, or relay_lease_ms = 0), else 0.",
		ConstLabels: prometheus.Labels{"broker": c.cfg.Outbox.Broker},
	}, func() float64 {
		if h.relay.Leading() {
			return 1
		}
		return 0
	}))
	ps := pools{pg: st.pool, rdb: c.br.redis}
	c.reg.MustRegister(newPoolCollector(ps))
	for _, p := range ps.stats() {
		c.log.Info("connection pool", "pool", p.Name, "max", p.Max)
	}
	if pg, ok := st.backend.(*unitofwork.Postgres); ok && c.partitioned() {
		// Every host's waits learn of a partition advance as it commits
		// (progressListener), not at their next poll of the unit's row.
		pg.Positions = pg.Positions.Notifying()
	}
	var committed wakeups
	committed.add(h.relay.Notify)
	uow := unitofwork.New(st.backend, unitofwork.Options{Keys: h.routes,
		BackfillSuffix: cfg.Server.PriorityLanes.BackfillSuffix,
		Broker:         cfg.Outbox.Broker, MaxRetries: cfg.Outbox.MaxRetries, Committed: committed.wake,
	})
	brokerProgress := &groups.Progress{}
	if dl, ok := c.br.source.(broker.DeadLetterFinder); ok {
		// (The inline broker: a wait meets a dead letter at once.)
		brokerProgress.DeadLetters = dl
	}
	progress := st.progress(c.partitioned(), c.fromStore)
	h.eng = engine.New(c.set, engine.Options{Events: st.events, Records: st.records, UnitOfWork: uow, Logger: c.log,
		Metrics: engine.NewMetrics(c.reg), Partitioned: c.partitioned(), EventStore: c.fromStore,
		Progress: progress, BrokerProgress: brokerProgress,
		MaxCascadeDepth: cfg.Plugins.Limits.MaxCascadeDepth, MaxFollowUps: cfg.Plugins.Limits.MaxFollowUps, Clock: c.clk,
		DocumentCacheBytes: cfg.Plugins.DocumentCacheMB << 20})
	c.reg.MustRegister(newInstanceCollector(h.eng.Set))
	h.sched = loader.Scheduler()
	c.reg.MustRegister(newShareCollector(h.sched))
	if err := h.composeSources(c, uow, infra, brokerProgress); err != nil {
		return err
	}
	if h.subs != nil {
		committed.add(h.subs.Notify)
	}
	// One LISTEN connection for whatever hears PostgreSQL's notifications.
	var channels []string
	p, progressed := progress.(*partition.Progress)
	if progressed = progressed && h.partitions != nil; progressed {
		p.Local = h.partitions // a wait on a unit this host runs reads nothing
	}
	if progressed = progressed && st.pool != nil; progressed {
		channels = append(channels, position.Channel)
	}
	pgOutbox, wakes := st.outbox.(*outbox.Postgres)
	if wakes = wakes && cfg.Outbox.RelayLease() > 0; wakes {
		channels = append(channels, outbox.RelayWakeChannel)
	}
	if len(channels) > 0 {
		h.notifications = newNotifications(st.pool.Config().ConnConfig, c.log, channels...)
	}
	if progressed {
		h.progress = newProgressListener(h.notifications.l, h.eng, h.partitions, cfg.Server.PriorityLanes.BackfillSuffix, cfg.Server.PriorityLanes.Enabled, c.log, c.reg)
	}
	if wakes {
		pgOutbox.ListenOver(h.notifications.l)
	}
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "protean_plugin_reloads_total",
		Help: "Plugin directory reloads, by outcome (applied, partial, unchanged, rejected, canceled)."}, []string{"outcome"})
	c.reg.MustRegister(reloads)
	h.reloader = host.NewReloader(host.ReloaderOptions{Loader: loader, Dir: cfg.Plugins.Dir, Broker: b,
		Running: c.set, Apply: h.apply, Logger: c.log, Clock: c.clk,
		// Only Redis partitions are re-partitioned mid-flight; event-store
		// subscriptions finish a batch by the partitioning it started with,
		// and the inline broker keeps no partitions across a swap.
		AllowRepartition: cfg.Plugins.AllowRepartition || !c.partitioned(),
		Observe:          func(o host.Outcome) { reloads.WithLabelValues(string(o)).Inc() }})
	h.watch = cfg.Plugins.Watch
	return nil
}

// newRelay builds the outbox relay. On the partition workers' path, a
// republish keeps what the running routes' partitions may still apply.
func newRelay(c *composition, infra *delivery.Metrics, rt *routes.Routes) *relay.Relay {
	cfg := c.cfg
	pub := c.br.pub
	if c.fromStore && c.br.redis == nil {
		// Nothing reads the inline broker when the handlers read the event
		// store: the relay marks the rows published without keeping them.
		pub = discardPublisher{c.br.pub}
	}
	o := relay.Options{
		Broker: cfg.Outbox.Broker, Owner: c.owner, Publisher: pub, Clock: c.clk,
		BatchSize: cfg.Outbox.MessagesPerTick, Tick: cfg.Outbox.TickInterval(), LockFor: cfg.Outbox.LockTimeout(),
		LeaseFor:  cfg.Outbox.RelayLease(),
		BaseDelay: cfg.Outbox.BaseRetryDelay(), MaxDelay: cfg.Outbox.MaxRetryDelay(), Jitter: cfg.Outbox.BackoffJitter,
		BackfillSuffix: cfg.Server.PriorityLanes.BackfillSuffix, LanesEnabled: cfg.Server.PriorityLanes.Enabled,
		LaneThreshold: cfg.Server.PriorityLanes.Threshold, Logger: c.log,
		PublishedRetention: cfg.Outbox.PublishedRetention(), AbandonedRetention: cfg.Outbox.AbandonedRetention(),
		RestartWindow: cfg.Outbox.RestartWindow(), Infra: infra,
	}
	if c.partitioned() {
		o.Partitions = rt.Partitions
	}
	return relay.New(c.st.outbox, o)
}

// composeSources builds the delivery sources the config names: the broker
// groups (unless the handlers read the event store), the partition
// workers (on Redis), the event-store subscriptions. Each hands its runs
// to the engine's handler and reads its groups from the routes.
func (h *hostProcess) composeSources(c *composition, uow *unitofwork.UnitOfWork, infra *delivery.Metrics, progress *groups.Progress) error {
	cfg := c.cfg
	retry := cfg.Server.StreamSubscription.Policy()
	if c.fromStore {
		var err error
		h.subs, err = newSubscriptions(cfg, c.st, h.eng.Handler(), h.routes.Subscriptions, uow, c.owner, c.reg, infra, c.log, c.clk)
		return err
	}
	h.groups = groups.New(groups.Options{Source: c.br.source, Handler: h.eng.Handler(), Classify: engine.Classify,
		Groups: h.routes.Groups, Handles: h.eng.Handles, Retry: retry, Infra: infra, Metrics: groups.NewMetrics(c.reg),
		Progress: progress, Logger: c.log, Clock: c.clk})
	h.routes.Follow(h.groups.Resubscribe)
	if !c.partitioned() {
		return nil
	}
	p, lanes := cfg.Server.Partitioning, cfg.Server.PriorityLanes
	var err error
	h.partitions, err = redispartition.NewConsumer(redispartition.ConsumerOptions{
		Leases: redispartition.NewLeases(c.br.redis, c.br.prefix), Positions: c.st.positions, Handler: h.eng.Handler(),
		Decode: redisstream.Decode, Subscriptions: h.routes.Partitions, Owner: c.owner,
		LeaseTTL: p.LeaseTTL(), Heartbeat: p.HeartbeatInterval(), Poll: p.PollInterval(), ReapIdle: p.ReapIdle(), AckDelay: p.AckDelay(),
		Retry: retry, Classify: engine.Classify, Infra: infra,
		Lanes: lanes.Enabled, BackfillSuffix: lanes.BackfillSuffix, WarnLivePartitions: p.WarnLivePartitions,
		Metrics: redispartition.NewMetrics(c.reg), Logger: c.log, Clock: c.clk,
	})
	if err != nil {
		return err
	}
	c.reg.MustRegister(h.partitions.LagCollector())
	return nil
}

// listen opens the HTTP listener and builds the server and its API; serve
// (a component's start) serves it.
func (h *hostProcess) listen(c *composition) error {
	if err := c.cfg.HTTP.CheckExposure(); err != nil {
		return err
	}
	authn, err := newAuthenticator(c.cfg.HTTP.Auth, nil)
	if err != nil {
		return err
	}
	if authn.Enabled() {
		c.log.Info("http: credentials required", "api_keys", len(authn.KeyIDs()), "oidc_issuer", c.cfg.HTTP.Auth.OIDC.Issuer)
	}
	h.auth = auth.NewLive(authn) // a SIGHUP swaps it (reloadAuth)
	ln, err := h.listener("http.listen", c.cfg.HTTP.Listen)
	if err != nil {
		return err
	}
	h.addr = ln.Addr().String()
	status, err := newHostStatus(c.cfg, c.st, c.br, h.routes, h.reloader, c.fromStore)
	if err != nil {
		return err
	}
	status.set, status.sched = h.eng.Set, h.sched
	o := local.Options{Tenancy: func() ops.Tenancy { return ops.TenancyOf(h.eng.Set()) }, Partitions: h.routes.Partitions, Admin: status.admin,
		BackfillSuffix: c.cfg.Server.PriorityLanes.BackfillSuffix, Outbox: c.st.outbox, Audit: c.st.audit}
	o.DeadLetters, _ = c.br.pub.(broker.DeadLetterer)
	if c.fromStore {
		o.Subscriptions, o.Positions, o.Leases, o.Head, o.Failures = h.routes.Subscriptions, c.st.positions, c.st.leases, c.st.head, c.st.failures
	} else {
		o.Groups = h.routes.Groups // the broker groups run: their dead letters replay
	}
	operations, err := local.New(o)
	if err != nil {
		return err
	}
	opts := httpapi.Options{Logger: c.log, Registry: c.reg, ReadWait: c.cfg.HTTP.ReadWait(),
		BodyTimeout: c.cfg.HTTP.ReadBodyTimeout(), Idempotency: c.st.idempotency, Status: status, Auth: h.auth, Ops: operations,
		Modules: newDeployer(c, h.reloader), Pprof: c.cfg.HTTP.Pprof, Tracing: telemetry.Enabled(),
		Version: hostVersion(), Started: c.started}
	if c.cfg.HTTP.Pprof {
		runtime.SetBlockProfileRate(pprofBlockRate)
		runtime.SetMutexProfileFraction(pprofMutexFraction)
		c.log.Info("http: pprof served under /debug/pprof/ on the admin routes", "block_rate_ns", pprofBlockRate, "mutex_fraction", pprofMutexFraction)
	}
	if c.cfg.HTTP.AdminListen == "" {
		h.srv, h.ln = newServer(c.cfg.HTTP, ln, httpapi.New(h.eng, opts), c.reg, c.log)
		return nil
	}
	ingress, admin := httpapi.NewSplit(h.eng, opts)
	h.srv, h.ln = newServer(c.cfg.HTTP, ln, ingress, c.reg, c.log)
	aln, err := h.listener("http.admin_listen", c.cfg.HTTP.AdminListen)
	if err != nil {
		return err
	}
	h.adminAddr = aln.Addr().String()
	// protean_http_connections_* count the API listener's connections;
	// the admin listener has its own bound, uncounted.
	h.adminSrv, h.adminLn = newServer(c.cfg.HTTP, aln, admin, prometheus.NewRegistry(), c.log)
	return nil
}

// The block and mutex profiles' sampling with [http] pprof: a block of
// 10 µs or more on average, one contention in 100. Both cost little at
// these rates; a load run's profile shows where requests wait.
const (
	pprofBlockRate     = 10_000
	pprofMutexFraction = 100
)

// listener opens addr, named by its config key in errors. Once serving,
// its server owns it; before, shutdown closes it.
func (h *hostProcess) listener(key, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", key, addr, err)
	}
	h.closers = append(h.closers, func() error {
		if h.serving {
			return nil
		}
		return ln.Close()
	})
	return ln, nil
}

// newAuthenticator builds what checks the API's credentials: the API
// keys and the OIDC issuer the config names (none: nil). An OIDC verifier
// of prev's (the running one, on a reload) that serves the same options
// is kept, with the keys it fetched.
func newAuthenticator(a config.HTTPAuth, prev *auth.Authenticator) (*auth.Authenticator, error) {
	if !a.Credentials() {
		return nil, nil
	}
	keys, err := auth.NewKeys(a.AuthKeys())
	if err != nil {
		return nil, fmt.Errorf("http.auth.keys: %w", err)
	}
	out := &auth.Authenticator{Keys: keys}
	if a.OIDC.Enabled() {
		if prev != nil && prev.OIDC != nil && prev.OIDC.Serves(a.OIDC.Options()) {
			out.OIDC = prev.OIDC
		} else if out.OIDC, err = auth.NewOIDC(a.OIDC.Options()); err != nil {
			return nil, fmt.Errorf("http.auth.oidc: %w", err)
		}
	}
	return out, nil
}

// serve starts serving HTTP.
func (h *hostProcess) serve(context.Context) error {
	h.serving = true
	go func() { h.served <- h.srv.Serve(h.ln) }()
	if h.adminSrv != nil {
		go func() { h.served <- h.adminSrv.Serve(h.adminLn) }()
	}
	return nil
}

// stopServing shuts the HTTP servers down: each stops taking requests
// and waits for those in flight.
func (h *hostProcess) stopServing(ctx context.Context) error {
	err := h.srv.Shutdown(ctx)
	if h.adminSrv != nil {
		err = errors.Join(err, h.adminSrv.Shutdown(ctx))
	}
	return err
}

// startReloader watches the plugins directory when the config asks for it
// (a SIGHUP reloads either way).
func (h *hostProcess) startReloader(ctx context.Context) error {
	if !h.watch {
		return nil
	}
	if err := h.reloader.Start(ctx); err != nil {
		return fmt.Errorf("plugins.watch: %w", err)
	}
	return nil
}

// apply makes a reloaded set the running one: the engine's, then the
// routes', whose followers (the broker groups) act on it; the partition
// workers, the event-store subscriptions and the relay read the routes
// each pass.
func (h *hostProcess) apply(set *host.Set) {
	h.eng.Swap(set)
	h.routes.Swap(set)
}

// wakeups calls each of its functions, in order: the unit of work's
// Committed wakes the relay and the event-store subscriptions. Functions
// are added while the components are built, before anything commits.
type wakeups []func()

func (w *wakeups) add(f func()) { *w = append(*w, f) }

func (w *wakeups) wake() {
	for _, f := range *w {
		f()
	}
}

// The engine answers ?min_position reads from its document cache.
var (
	_ httpapi.HandledWaiter = (*engine.Engine)(nil)
	_ httpapi.DocumentCache = (*engine.Engine)(nil)
)
