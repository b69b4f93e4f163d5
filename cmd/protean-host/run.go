package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/internal/auth"
	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/engine"
	"github.com/proteanhq/protean-host/internal/groups"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/owner"
	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/redisstream"
	"github.com/proteanhq/protean-host/internal/relay"
	"github.com/proteanhq/protean-host/internal/routes"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/telemetry"
	"github.com/proteanhq/protean-host/outbox"
)

// defaultShutdownTimeout bounds the soft stop (drain) before work is
// canceled; run's --shutdown-timeout changes it.
const defaultShutdownTimeout = 15 * time.Second

// openedBroker is the outbox broker the config names: what the relay
// publishes to, what the engine's ordinary consumers read, and, on Redis,
// the client the partition workers share.
type openedBroker struct {
	pub    broker.Publisher
	source groups.Source
	redis  redis.UniversalClient // nil for the inline broker
	prefix string                // of every Redis key
	close  func() error
}

// openBroker opens the outbox broker the config names.
func openBroker(ctx context.Context, cfg config.Config, owner string, clk clock.Clock, log *slog.Logger) (*openedBroker, error) {
	b := cfg.OutboxBroker()
	opts := brokerOptions(cfg)
	opts.Clock = clk
	opts.Logger = log // a dead-lettered or discarded message is a warning
	switch b.Provider {
	case config.ProviderInline:
		in, err := broker.NewInline(opts)
		if err != nil {
			return nil, err
		}
		return &openedBroker{pub: in, source: in, close: in.Close}, nil
	case config.ProviderRedis:
		ropts, err := redis.ParseURL(b.URI)
		if err != nil {
			return nil, fmt.Errorf("brokers.%s.uri: %w", cfg.Outbox.Broker, err)
		}
		if !strings.Contains(b.URI, "pool_size") {
			ropts.PoolSize = redisPoolSize(countModules(cfg.Plugins.Dir), runtime.GOMAXPROCS(0))
		}
		rdb := redis.NewClient(ropts)
		if err := rdb.Ping(ctx).Err(); err != nil {
			_ = rdb.Close()
			return nil, fmt.Errorf("connecting to Redis (brokers.%s.uri): %w", cfg.Outbox.Broker, err)
		}
		rb, err := redisstream.New(rdb, redisstream.Options{Options: opts, Consumer: owner, Prefix: b.KeyPrefix, Epoch: true})
		if err != nil {
			_ = rdb.Close()
			return nil, err
		}
		return &openedBroker{pub: rb, source: rb, redis: rdb, prefix: b.KeyPrefix, close: func() error {
			return errors.Join(rb.Close(), rdb.Close())
		}}, nil
	}
	return nil, fmt.Errorf("brokers.%s.provider %q: not available (use \"inline\" or \"redis\")", cfg.Outbox.Broker, b.Provider)
}

// brokerOptions are the delivery settings of the config's broker.
func brokerOptions(cfg config.Config) broker.Options {
	opts := broker.DefaultOptions()
	opts.Policy = cfg.Server.StreamSubscription.Policy()
	return opts
}

func cmdRun(ctx context.Context, e *env, args []string) error {
	fs := e.flags("run")
	listen := fs.String("listen", "", "HTTP listen `ADDR` (overrides [http] listen)")
	drain := fs.Duration("shutdown-timeout", defaultShutdownTimeout,
		"on SIGINT/SIGTERM, how long in-flight work may drain before it is canceled (`DURATION`)")
	watch := fs.Bool("watch", false, "reload the plugins directory when a *.wasm file changes (sets [plugins] watch = true)")
	if err := e.parseOrDefault(fs, args); err != nil {
		return err
	}
	if e.embedded {
		e.log.Info("no config file: running the embedded default (memory stores, inline broker); --config FILE to choose",
			"missing", defaultConfig, "plugins", e.cfg.Plugins.Dir)
	}
	if *watch {
		e.cfg.Plugins.Watch = true
	}
	if *drain <= 0 {
		return fmt.Errorf("--shutdown-timeout %s: must be positive", *drain)
	}
	if err := e.checkConfigFile(); err != nil {
		return err
	}
	if *listen != "" {
		e.cfg.HTTP.Listen = *listen
	}
	// SIGHUP is caught before the start: the host is healthy (and so
	// signaled) before start returns, and an uncaught SIGHUP would end the
	// process. One that arrives during the start waits in the channel and
	// reloads once the start is done.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	h, err := start(ctx, e)
	if err != nil {
		return err
	}
	h.shutdownTimeout = *drain
	// A reload runs beside this loop, never in it: compiling a new set
	// can take seconds (up to compile_timeout_ms per module), and SIGTERM
	// must be heard meanwhile. A shutdown cancels the reload (its
	// compilations are abandoned at once) and waits at most the drain.
	rctx, cancelReload := context.WithCancel(ctx)
	defer cancelReload()
	var reloading chan struct{}
	stopReload := func() {
		cancelReload()
		if reloading == nil {
			return
		}
		select {
		case <-reloading:
		case <-time.After(h.shutdownTimeout):
			e.log.Warn("the plugin reload in progress did not return after cancel; shutting down beside it")
		}
	}
	for {
		select {
		case <-ctx.Done():
			e.log.Info("shutting down: draining in-flight work", "timeout", h.shutdownTimeout)
			stopReload()
			return h.shutdown()
		case err := <-h.served:
			h.serveErr = err
			stopReload()
			return h.shutdown()
		case <-hup:
			h.reloadAuth(e)
			if reloading != nil {
				select {
				case <-reloading:
				default:
					e.log.Warn("SIGHUP: a reload is already in progress; ignored", "dir", e.cfg.Plugins.Dir)
					continue
				}
			}
			e.log.Info("SIGHUP: reloading plugins", "dir", e.cfg.Plugins.Dir)
			done := make(chan struct{})
			reloading = done
			go func() {
				defer close(done)
				h.reloader.Reload(rctx)
			}()
		}
	}
}

// hostProcess is a started host: what shutdown stops, in order.
type hostProcess struct {
	addr     string
	owner    string // this start's name in leases and locks
	served   chan error
	serveErr error
	srv      *http.Server
	// adminSrv serves the admin routes on [http] admin_listen (adminLn,
	// adminAddr); nil when they are on srv.
	adminSrv  *http.Server
	adminLn   net.Listener
	adminAddr string
	eng       *engine.Engine
	// sched shares the guest slots between tenants (nil: no sharing).
	sched *host.Scheduler
	relay *relay.Relay
	// partitions is the partitioned consumer; nil without a Redis broker.
	partitions *redispartition.Consumer
	// progress hands other hosts' partition advances to the engine's
	// read-your-writes waits; nil unless partitions run on PostgreSQL.
	progress *progressListener
	// notifications is the LISTEN connection of progress and of the
	// relay's wake-ups; nil when neither listens.
	notifications *notifications
	// subs runs the event-store subscriptions; nil unless the delivery is
	// event_store (config.Config.SubscriptionType).
	subs *subscription.Consumer
	// groups runs the broker consumer groups; nil when subs runs.
	groups *groups.Consumer
	// routes are the running set's routes, which a reload swaps (apply).
	routes *routes.Routes
	// ln is what srv serves (the listener, limited); serving is set once
	// it does, and watch when the reloader watches the plugins directory.
	ln       net.Listener
	serving  bool
	watch    bool
	reloader *host.Reloader
	closers  []func() error
	log      *slog.Logger
	// shutdownTimeout is the drain's bound (defaultShutdownTimeout).
	shutdownTimeout time.Duration
	// guestsRunning is set when the engine's stop left a guest call
	// running (engine.ErrAbandoned): the module set and the loader's
	// compiled code are then not closed under it; the process's exit ends
	// the call.
	guestsRunning bool
	// auth is the API's credentials, which a SIGHUP swaps (reloadAuth).
	auth *auth.Live
}

// start opens the stores and the broker, loads and validates the plugins,
// builds the components in dependency order (compose.go) and starts them
// (components, last first), the HTTP server among them. If a step fails,
// what the steps before it started is stopped (as shutdown does) and what
// they opened is closed.
func start(ctx context.Context, e *env) (_ *hostProcess, err error) {
	cfg := e.cfg
	// One owner name per start (not per process: a test runs several
	// hosts in one), unique even where every container is pid 1 on one
	// hostname (package owner).
	started := time.Now()
	h := &hostProcess{log: e.log, owner: owner.New(), served: make(chan error, 2), shutdownTimeout: defaultShutdownTimeout}
	defer func() {
		if err != nil {
			err = errors.Join(err, h.shutdown())
		}
	}()
	e.log.Info("owner", "owner", h.owner, "version", hostVersion())
	if err := h.trace(ctx, cfg.Telemetry); err != nil {
		return nil, err
	}
	clk := clock.System // one clock for every component, so that their waits are one time
	st, err := openStores(ctx, cfg)
	if err != nil {
		return nil, err
	}
	h.closers = append(h.closers, func() error { st.close(); return nil })
	br, err := openBroker(ctx, cfg, h.owner, clk, e.log)
	if err != nil {
		return nil, err
	}
	h.closers = append(h.closers, br.close)
	loader, set, err := h.loadPlugins(ctx, e)
	if err != nil {
		return nil, err
	}
	c := &composition{cfg: cfg, st: st, br: br, set: set, log: e.log, clk: clk, owner: h.owner, started: started,
		reg: prometheus.NewRegistry(), fromStore: cfg.SubscriptionType() == config.SubscriptionEventStore}
	if err := h.compose(c, loader, e.broker()); err != nil {
		return nil, err
	}
	if err := h.listen(c); err != nil {
		return nil, err
	}
	cs := h.components()
	for i := len(cs) - 1; i >= 0; i-- {
		if cs[i].present && cs[i].start != nil {
			if err := cs[i].start(ctx); err != nil {
				return nil, fmt.Errorf("%s: %w", cs[i].name, err)
			}
		}
	}
	e.log.Info("listening", "addr", h.addr, "admin_addr", cmp.Or(h.adminAddr, h.addr), "config", e.configPath)
	return h, nil
}

// trace installs OpenTelemetry tracing if [telemetry] tracing is on
// (package telemetry); closing the host flushes the spans not yet sent.
func (h *hostProcess) trace(ctx context.Context, t config.Telemetry) error {
	if !t.Tracing {
		return nil
	}
	stop, err := telemetry.Setup(ctx, telemetry.Options{Endpoint: t.Endpoint, SampleRatio: t.SampleRatio,
		ServiceName: t.ServiceName, Version: hostVersion(), Instance: h.owner})
	if err != nil {
		return err
	}
	h.closers = append(h.closers, func() error {
		fctx, cancel := context.WithTimeout(context.Background(), telemetryFlush)
		defer cancel()
		return stop(fctx)
	})
	h.log.Info("tracing: spans exported over OTLP/HTTP", "endpoint", cmp.Or(t.Endpoint, "from OTEL_EXPORTER_OTLP_ENDPOINT, else http://localhost:4318"),
		"enabled", telemetry.Enabled())
	return nil
}

// telemetryFlush bounds the flush of the spans not yet exported at exit.
const telemetryFlush = 5 * time.Second

// component is one part of a running host that start starts (unless
// start is nil) and shutdown stops.
type component struct {
	name    string
	present bool // built: start got that far
	start   func(context.Context) error
	stop    func(context.Context) error
}

// components are what shutdown stops, in its order: what takes work in
// first (reloads, requests), then what delivers it, then the engine that
// runs it, then the relay that publishes what it committed. start starts
// them in the reverse order. A part start never built is not present. The
// shutdown doc names them in this order (TestShutdownDocNamesItsOrder).
func (h *hostProcess) components() []component {
	return []component{
		{"plugin reloader", h.reloader != nil, h.startReloader, func(ctx context.Context) error { return h.reloader.Stop(ctx) }},
		{"http", h.srv != nil, h.serve, h.stopServing},
		{"progress listener", h.progress != nil, func(ctx context.Context) error { return h.progress.start(ctx) },
			func(ctx context.Context) error { return h.progress.stop(ctx) }},
		{"partition workers", h.partitions != nil, func(ctx context.Context) error { return h.partitions.Start(ctx) },
			func(ctx context.Context) error { return h.partitions.Stop(ctx) }},
		{"event-store subscriptions", h.subs != nil, func(ctx context.Context) error { return h.subs.Start(ctx) },
			func(ctx context.Context) error { return h.subs.Stop(ctx) }},
		{"broker groups", h.groups != nil, func(ctx context.Context) error { return h.groups.Start(ctx) },
			func(ctx context.Context) error { return h.groups.Stop(ctx) }},
		{"engine", h.eng != nil, nil, func(ctx context.Context) error { return h.eng.Stop(ctx) }},
		{"outbox relay", h.relay != nil, func(ctx context.Context) error { return h.relay.Start(ctx) },
			func(ctx context.Context) error { return h.relay.Stop(ctx) }},
		{"notifications listener", h.notifications != nil, func(ctx context.Context) error { return h.notifications.start(ctx) },
			func(ctx context.Context) error { return h.notifications.stop(ctx) }},
	}
}

// shutdown stops what start started, in order (components): the plugin
// reloader, the http server (no new requests), the progress listener (no
// waits left to wake), the partition workers, the
// event-store subscriptions and the broker groups (no new messages; the
// runs in hand commit), the engine (commands and the messages in hand drain), the
// outbox relay (its pass in progress finishes), the notifications
// listener (no part left to hear them); then it closes the broker,
// the stores, the module set and the loader. Every stop is soft until
// shutdownTimeout, counted from the first: past it, work in progress is
// canceled and each stop returns within its own small grace (so shutdown
// returns within the timeout plus a few graces). A guest call that cannot
// be canceled (interruptible = false) is left running, and the module set
// and the compiled code it runs on are not closed under it: the process's
// exit ends it. Parts start never reached are skipped.
func (h *hostProcess) shutdown() error {
	timeout := h.shutdownTimeout
	if timeout <= 0 {
		timeout = defaultShutdownTimeout
	}
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var errs []error
	for _, c := range h.components() {
		if !c.present {
			continue
		}
		err := c.stop(sctx)
		if err == nil {
			continue
		}
		if c.name == "engine" && errors.Is(err, engine.ErrAbandoned) {
			h.guestsRunning = true
			h.log.Warn("guest calls still running past the drain are left to the process's exit", "timeout", timeout)
		}
		errs = append(errs, fmt.Errorf("%s: %w", c.name, err))
	}
	if h.serveErr != nil && !errors.Is(h.serveErr, http.ErrServerClosed) {
		errs = append(errs, h.serveErr)
	}
	if err := h.close(); err != nil {
		errs = append(errs, err)
	}
	h.log.Info("stopped")
	return errors.Join(errs...)
}

// close runs the closers in reverse order of opening and returns what
// they reported: a store or broker that fails to close may have lost
// writes, which the exit status should say.
func (h *hostProcess) close() error {
	var errs []error
	for i := len(h.closers) - 1; i >= 0; i-- {
		if err := h.closers[i](); err != nil {
			errs = append(errs, fmt.Errorf("close: %w", err))
		}
	}
	h.closers = nil
	return errors.Join(errs...)
}

// outboxCollector exports the outbox's row counts and oldest pending age.
type outboxCollector struct {
	store interface {
		Stats(ctx context.Context) (outbox.Stats, error)
	}
	rows   *prometheus.Desc
	oldest *prometheus.Desc
	// failures counts scrapes whose Stats failed: a failed read is
	// reported there and logged, not turned into an invalid metric,
	// which would fail the whole scrape and hide every other metric.
	failures prometheus.Counter
	log      *slog.Logger
}

func newOutboxCollector(s outbox.Store, log *slog.Logger) *outboxCollector {
	return &outboxCollector{store: s, log: log,
		rows:   prometheus.NewDesc("protean_outbox_rows", "Outbox rows by status.", []string{"status"}, nil),
		oldest: prometheus.NewDesc("protean_outbox_oldest_pending_seconds", "Age of the oldest pending outbox row (0 when none).", nil, nil),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "protean_outbox_stats_errors_total",
			Help: "Scrapes whose read of the outbox's row counts failed."})}
}

func (c *outboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.rows
	ch <- c.oldest
	ch <- c.failures.Desc()
}

func (c *outboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := c.store.Stats(ctx)
	if err != nil {
		c.failures.Inc()
		ch <- c.failures
		c.log.Warn("outbox stats failed: outbox metrics missing from this scrape", "error", err)
		return
	}
	ch <- c.failures
	for status, n := range st.Counts {
		ch <- prometheus.MustNewConstMetric(c.rows, prometheus.GaugeValue, float64(n), string(status))
	}
	age := 0.0
	if st.OldestPending != nil {
		age = time.Since(*st.OldestPending).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age)
}
