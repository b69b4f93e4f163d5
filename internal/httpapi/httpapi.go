package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/auth"
	"github.com/proteanhq/protean-host/internal/engine"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/idempotency"
	"github.com/proteanhq/protean-host/internal/ops"
	"github.com/proteanhq/protean-host/internal/readyourwrites"
	"github.com/proteanhq/protean-host/internal/unitofwork"
)

// MaxBodyBytes bounds a command body.
const MaxBodyBytes = 1 << 20

// Engine is what the API needs of the engine.
type Engine interface {
	Dispatch(ctx context.Context, typ string, data json.RawMessage, md abi.Metadata) (*engine.CommandResult, error)
	Projection(ctx context.Context, name, id string) (json.RawMessage, int64, error)
	Set() *host.Set
	// Healthy returns nil while the engine accepts work.
	Healthy() error
}

// HandledWaiter is the optional ability of an Engine behind
// GET /v1/projections/{name}/{id}?min_position=N: wait until the
// projection's handler has handled global position N, as far as document
// id is concerned (see engine.Engine.WaitDocument); an error that
// errors.Is readyourwrites.ErrNotCaughtUp when ctx ended first.
type HandledWaiter interface {
	WaitDocument(ctx context.Context, projection, id string, position int64) error
}

// DocumentCache is an engine that may hold a projection's document as of
// a global position in memory (engine.Engine.CachedDocument): a
// ?min_position read it answers needs neither the wait nor the database.
type DocumentCache interface {
	CachedDocument(projection, id string, position int64) (json.RawMessage, int64, bool)
}

// Options configure the API handler.
type Options struct {
	Logger *slog.Logger
	// Registry serves GET /metrics and receives the API's own metrics.
	Registry *prometheus.Registry
	// ReadWait bounds a projection read's wait for ?min_position
	// (DefaultReadWait if zero); past it the read answers 504.
	ReadWait time.Duration
	// Idempotency keeps the answers of commands sent with an
	// Idempotency-Key; nil ignores the header.
	Idempotency idempotency.Store
	// Status feeds the status page (GET /) and the reload part of GET
	// /v1/plugins. Optional.
	Status Status
	// Version is the host's build (the status page's header and GET
	// /v1/plugins); Started is when the process started, for the uptime.
	// Both optional.
	Version string
	Started time.Time
	// Auth authenticates the credential every route but /healthz asks for
	// (access.go): each request uses the authenticator it holds when the
	// request arrives, so a reload can swap it. nil, or none configured,
	// lets every request through (a loopback-only host).
	Auth *auth.Live
	// BodyTimeout bounds the reading of a command body (DefaultBodyTimeout
	// if zero); past it the command answers 408 ([http]
	// read_body_timeout_ms). It is a read deadline on the connection set
	// for the body alone: http.Server.ReadTimeout would also cancel the
	// request's context once it passed, cutting a ?min_position wait or a
	// long command.
	BodyTimeout time.Duration
	// Pprof serves net/http/pprof under /debug/pprof/ to admins, on the
	// admin routes ([http] pprof).
	Pprof bool
	// Ops serves the operations API under /v1/ops (ops.go); nil serves
	// none.
	Ops ops.API
	// Modules serves the deploy routes (modules.go); nil: they answer 404.
	Modules Modules
	// Tracing makes a server span of each request but /healthz, the
	// status page and pprof's (OpenTelemetry, telemetry.Setup): a child
	// of the request's W3C traceparent if it has one, named by its route,
	// and answered in the response's traceparent header.
	Tracing bool
}

// DefaultBodyTimeout is the bound on reading a command body when Options
// set none.
const DefaultBodyTimeout = 30 * time.Second

// DefaultReadWait is the bound of a ?min_position wait when Options set
// none ([http] read_wait_ms).
const DefaultReadWait = 5 * time.Second

type api struct {
	e           Engine
	log         *slog.Logger
	readWait    time.Duration
	bodyTimeout time.Duration
	idem        idempotency.Store
	status      Status
	version     string
	started     time.Time
	auth        *auth.Live
	authm       *authMetrics
	ops         ops.API
	modules     Modules
	tracing     bool
	requests    *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	// readsFromCache and readsFromDatabase count the projection reads
	// answered, by where from (protean_projection_reads_total).
	readsFromCache, readsFromDatabase prometheus.Counter
}

// New returns the HTTP API of a running host: every route on one handler.
func New(e Engine, opts Options) http.Handler {
	h, _ := build(e, opts, false)
	return h
}

// NewSplit returns the HTTP API of a running host as two handlers, for
// two listeners ([http] admin_listen): ingress serves commands,
// projections and /healthz; admin serves the status page, /metrics,
// /v1/plugins, the operations and deploy routes, and /healthz. Each
// answers 404 for the other's routes, naming where they are.
func NewSplit(e Engine, opts Options) (ingress, admin http.Handler) {
	return build(e, opts, true)
}

// muxes are the ingress and admin routes: one mux unless split.
type muxes struct {
	ingress, admin *http.ServeMux
}

// adminRoute reports whether pattern ("METHOD /path") is an admin route.
func adminRoute(pattern string) bool {
	_, path, _ := strings.Cut(pattern, " ")
	return path == "/{$}" || path == "/" || path == "/metrics" || path == "/v1/plugins" ||
		strings.HasPrefix(path, "/v1/ops/") || strings.HasPrefix(path, "/v1/modules") || strings.HasPrefix(path, "/debug/pprof/")
}

// HandleFunc registers h for pattern on its side's mux (both for
// /healthz).
func (m *muxes) HandleFunc(pattern string, h http.HandlerFunc) {
	switch {
	case m.admin == m.ingress:
		m.ingress.HandleFunc(pattern, h)
	case pattern == "GET /healthz":
		m.ingress.HandleFunc(pattern, h)
		m.admin.HandleFunc(pattern, h)
	case adminRoute(pattern):
		m.admin.HandleFunc(pattern, h)
	default:
		m.ingress.HandleFunc(pattern, h)
	}
}

func build(e Engine, opts Options, split bool) (ingress, admin http.Handler) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.ReadWait <= 0 {
		opts.ReadWait = DefaultReadWait
	}
	if opts.BodyTimeout <= 0 {
		opts.BodyTimeout = DefaultBodyTimeout
	}
	a := &api{e: e, log: opts.Logger, readWait: opts.ReadWait, bodyTimeout: opts.BodyTimeout, idem: opts.Idempotency, status: opts.Status,
		version: opts.Version, started: opts.Started,
		auth: opts.Auth, modules: opts.Modules, authm: newAuthMetrics(opts.Registry), ops: opts.Ops, tracing: opts.Tracing,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "protean_http_requests_total",
			Help: "HTTP requests, by route and status code."}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "protean_http_request_seconds",
			Help: "HTTP request duration, by route.", Buckets: prometheus.ExponentialBuckets(0.0005, 4, 8)}, []string{"route"}),
	}
	documentReads := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "protean_projection_reads_total",
		Help: "Projection documents answered (GET /v1/projections/{name}/{id}), by where from: cache (the host's memory, a read as of min_position its partition unit committed here: no wait, no database) or database."}, []string{"from"})
	a.readsFromCache, a.readsFromDatabase = documentReads.WithLabelValues("cache"), documentReads.WithLabelValues("database")
	opts.Registry.MustRegister(a.requests, a.latency, documentReads)
	mux := &muxes{ingress: http.NewServeMux()}
	mux.admin = mux.ingress
	if split {
		mux.admin = http.NewServeMux()
	}
	a.route(mux, "POST /v1/commands/{type}", commandGuard, a.idempotentCommand)
	a.route(mux, "GET /v1/projections/{name}/{id}", projectionGuard, a.projection)
	a.route(mux, "GET /v1/plugins", adminGuard, a.plugins)
	a.routeOps(mux, opts.Ops)
	a.route(mux, "GET /healthz", open, a.healthz)
	a.route(mux, "GET /{$}", opsGuard, a.page)
	a.routeModules(mux)
	if opts.Pprof {
		a.route(mux, "GET /debug/pprof/", adminGuard, pprof.Index) // and every named profile under it
		a.route(mux, "GET /debug/pprof/cmdline", adminGuard, pprof.Cmdline)
		a.route(mux, "GET /debug/pprof/profile", adminGuard, pprof.Profile)
		a.route(mux, "GET /debug/pprof/symbol", adminGuard, pprof.Symbol)
		a.route(mux, "GET /debug/pprof/trace", adminGuard, pprof.Trace)
	}
	metrics := promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := a.admit(w, r, "GET /metrics", adminGuard); ok {
			metrics.ServeHTTP(w, r)
		}
	})
	if !split {
		h := serveMux(mux.ingress, "")
		return h, h
	}
	return serveMux(mux.ingress, "ingress"), serveMux(mux.admin, "admin")
}

// serveMux answers what mux does not match with JSON too (405 with
// Allow for a known path used with another method, else 404; on a split
// listener, 404 naming the listener that serves it), and refuses a path
// that is not UTF-8 or holds a NUL (it names no command, projection or
// document) with 400 before any route sees it.
func serveMux(mux *http.ServeMux, side string) http.Handler {
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		allow := allowed(r.URL.Path)
		if allow != "" && side != "" && adminRoute(r.Method+" "+r.URL.Path) != (side == "admin") && r.URL.Path != "/healthz" {
			other := "[http] admin_listen"
			if side == "admin" {
				other = "[http] listen"
			}
			writeError(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s here: it is served on %s", r.Method, r.URL.Path, other))
			return
		}
		if allow != "" {
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s %s: use %s", r.Method, r.URL.Path, allow))
			return
		}
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if why := checkPath(r.URL.Path); why != "" {
			writeError(w, http.StatusBadRequest, why)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// allowed returns the method a known path takes, or "".
func allowed(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if m := moduleMethods(parts); m != "" {
		return m
	}
	switch {
	case len(parts) == 3 && parts[0] == "v1" && parts[1] == "commands":
		return http.MethodPost
	case len(parts) == 4 && parts[0] == "v1" && parts[1] == "projections",
		path == "/v1/plugins", path == "/healthz", path == "/metrics", path == "/":
		return http.MethodGet
	case len(parts) >= 3 && parts[0] == "v1" && parts[1] == "ops":
		return opsAllowed(parts[2:])
	}
	return ""
}

// statusWriter remembers the status code for metrics.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// route serves pattern with h, once g admits the request (access.go),
// and counts it.
func (a *api) route(mux *muxes, pattern string, g guard, h http.HandlerFunc) {
	serve := func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		if r, ok := a.admit(sw, r, pattern, g); ok {
			h(sw, r)
		}
		a.requests.WithLabelValues(pattern, strconv.Itoa(sw.code)).Inc()
		a.latency.WithLabelValues(pattern).Observe(time.Since(start).Seconds())
	}
	if a.tracing && traced(pattern) {
		mux.HandleFunc(pattern, traceRoute(pattern, serve))
		return
	}
	mux.HandleFunc(pattern, serve)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// encodeJSON is v in the bytes writeJSON sends.
func encodeJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	err := json.NewEncoder(&b).Encode(v)
	return b.Bytes(), err
}

// MaxErrorBytes bounds the message of an error answer (and of its log
// line): a message quoting a client's huge value is cut, so the answer
// stays short whatever the input.
const MaxErrorBytes = 512

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": abi.Clip(msg, MaxErrorBytes)})
}

// status maps an engine error to its HTTP status.
func status(err error) int {
	var he *engine.HandlerError
	var ke *unitofwork.KeyError
	switch {
	case errors.Is(err, engine.ErrBadInput):
		return http.StatusBadRequest
	case errors.Is(err, engine.ErrUnknownCommand), errors.Is(err, engine.ErrUnknownProjection), errors.Is(err, engine.ErrNotFound):
		return http.StatusNotFound
	case unitofwork.Conflict(err):
		return http.StatusConflict
	case errors.As(err, &ke), errors.Is(err, abi.ErrInput):
		return http.StatusUnprocessableEntity
	case errors.As(err, &he) && he.Rejected():
		return http.StatusUnprocessableEntity
	case errors.Is(err, engine.ErrStopped), errors.Is(err, host.ErrNotReady):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// notReadyRetry is the Retry-After, in seconds, of a command whose module
// was still compiling: a Go module compiles in a few seconds.
const notReadyRetry = "2"

// command dispatches the command in body (read once, by the caller).
func (a *api) command(w http.ResponseWriter, r *http.Request, body []byte) {
	typ := r.PathValue("type")
	if at := invalidUTF8(body); at >= 0 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("request body is not valid UTF-8 at byte offset %d", at))
		return
	}
	if why := notObject(body); why != "" {
		writeError(w, http.StatusBadRequest, "request body must be a JSON object: "+why)
		return
	}
	if ie := checkValues(typ, body); ie != nil {
		writeInputError(w, ie)
		return
	}
	md := abi.Metadata{CorrelationID: r.Header.Get(CorrelationHeader)}
	res, err := a.e.Dispatch(r.Context(), typ, body, md)
	if err != nil {
		code := status(err)
		if code >= 500 {
			a.log.Error("command failed", "type", abi.Clip(typ, abi.ClipLength), "error", abi.Clip(err.Error(), MaxErrorBytes))
		}
		var ie *abi.InputError
		if errors.As(err, &ie) {
			writeInputError(w, ie)
			return
		}
		if errors.Is(err, host.ErrNotReady) {
			w.Header().Set("Retry-After", notReadyRetry)
		}
		writeError(w, code, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// writeInputError answers 422 for a payload that does not match its
// declaration: {"error": "...", "fields": ["total", ...]}, the fields in
// the order of the problems.
func writeInputError(w http.ResponseWriter, ie *abi.InputError) {
	writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"error": abi.Clip(ie.Error(), MaxErrorBytes), "fields": ie.Fields()})
}

func (a *api) projection(w http.ResponseWriter, r *http.Request) {
	if q := r.URL.Query().Get("min_position"); q != "" || r.URL.Query().Has("min_position") {
		n, err := strconv.ParseInt(q, 10, 64)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("min_position must be a global position, an integer >= 0 (got %q)", abi.Clip(q, abi.ClipLength)))
			return
		}
		// Held in memory as of n: no wait, no read. Else after the wait,
		// which usually ends with the commit that put it there.
		if a.cachedDocument(w, r, n) {
			return
		}
		if !a.waitHandled(w, r, n) || a.cachedDocument(w, r, n) {
			return
		}
	}
	data, version, err := a.e.Projection(r.Context(), r.PathValue("name"), r.PathValue("id"))
	if err != nil {
		writeError(w, status(err), err.Error())
		return
	}
	a.readsFromDatabase.Inc()
	writeDocument(w, data, version)
}

// cachedDocument answers the document from the engine's memory if it
// holds it as of n or later, and reports whether it did.
func (a *api) cachedDocument(w http.ResponseWriter, r *http.Request, n int64) bool {
	c, ok := a.e.(DocumentCache)
	if !ok {
		return false
	}
	data, version, ok := c.CachedDocument(r.PathValue("name"), r.PathValue("id"), n)
	if ok {
		a.readsFromCache.Inc()
		writeDocument(w, data, version)
	}
	return ok
}

// writeDocument answers a projection's document.
func writeDocument(w http.ResponseWriter, data json.RawMessage, version int64) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Record-Version", strconv.FormatInt(version, 10))
	_, _ = w.Write(data)
}

// waitHandled serves ?min_position=n: it waits, at most readWait, until
// the projection has handled global position n, and reports whether the
// read may go on; if not, it has answered (404 for an unknown projection,
// 504 past the bound, 500 naming an event at or below n that the handler
// failed and that waits for an operator: readyourwrites.ErrFailed, so the
// client never gets a document that silently lacks its write).
func (a *api) waitHandled(w http.ResponseWriter, r *http.Request, n int64) bool {
	hw, ok := a.e.(HandledWaiter)
	if !ok {
		writeError(w, http.StatusNotImplemented, "min_position is not supported by this engine")
		return false
	}
	name := r.PathValue("name")
	ctx, cancel := context.WithTimeout(r.Context(), a.readWait)
	defer cancel()
	if err := hw.WaitDocument(ctx, name, r.PathValue("id"), n); err != nil {
		if errors.Is(err, readyourwrites.ErrNotCaughtUp) {
			writeError(w, http.StatusGatewayTimeout, fmt.Sprintf("projection %s has not handled global position %d within %s; it is eventually consistent: retry later", name, n, a.readWait))
			return false
		}
		writeError(w, status(err), err.Error())
		return false
	}
	return true
}

func (a *api) plugins(w http.ResponseWriter, r *http.Request) {
	set := a.e.Set()
	var reload *host.ReloadStatus
	var pools []Pool
	if a.status != nil {
		snap, err := a.status.Status(r.Context())
		if err != nil {
			a.log.Warn("status unavailable for /v1/plugins", "error", err)
		}
		reload, pools = snap.Reload, snap.Pools
	}
	out := struct {
		Host          hostJSON          `json:"host"`
		Plugins       []Plugin          `json:"plugins"`
		PartitionKeys map[string]string `json:"partition_keys"`
		LastReload    *reloadJSON       `json:"last_reload,omitempty"`
		Pools         []Pool            `json:"pools,omitempty"`
	}{Host: a.host(), Plugins: Plugins(set, reload), PartitionKeys: map[string]string{}, LastReload: reloadOf(reload), Pools: pools}
	for c, k := range set.Keys() {
		out.PartitionKeys[c] = k.Field
	}
	writeJSON(w, http.StatusOK, out)
}

// hostJSON is the host's build and uptime as GET /v1/plugins shows them.
type hostJSON struct {
	Version       string     `json:"version,omitempty"`
	Started       *time.Time `json:"started,omitempty"`
	UptimeSeconds float64    `json:"uptime_seconds,omitempty"`
}

func (a *api) host() hostJSON {
	h := hostJSON{Version: a.version}
	if !a.started.IsZero() {
		started := a.started.UTC()
		h.Started, h.UptimeSeconds = &started, time.Since(a.started).Truncate(time.Millisecond).Seconds()
	}
	return h
}

// reloadJSON is the last reload as GET /v1/plugins shows it.
type reloadJSON struct {
	At       time.Time           `json:"at"`
	Outcome  host.Outcome        `json:"outcome"`
	TookMS   float64             `json:"took_ms"`
	Changes  []host.ModuleChange `json:"changes,omitempty"`
	Problems []host.FileProblem  `json:"problems,omitempty"`
}

func reloadOf(r *host.ReloadStatus) *reloadJSON {
	if r == nil {
		return nil
	}
	return &reloadJSON{At: r.At, Outcome: r.Outcome, TookMS: float64(r.Took.Microseconds()) / 1000, Changes: r.Changes, Problems: r.Problems}
}

func (a *api) healthz(w http.ResponseWriter, _ *http.Request) {
	if err := a.e.Healthy(); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "error": err.Error()})
		return
	}
	set := a.e.Set()
	if n := set.Warming(); n > 0 {
		// Served, but some modules' code is still being compiled (loaded
		// from their manifest memo): their first calls wait for it.
		writeJSON(w, http.StatusOK, map[string]any{"status": "starting", "plugins": len(set.Modules()), "compiling": n})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "plugins": len(set.Modules())})
}
