package httpapi

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/auth"
	"github.com/proteanhq/protean-host/internal/host"
)

// Access control (package auth): every route but /healthz names, through
// its guard, what a request asks and for which tenant; route() checks it
// before the handler runs, in this one place. Without credentials
// (Options.Auth not Enabled) every request is let through, as on a loopback-only host
// (config.HTTP.CheckExposure).
//
// A request without a credential, or with one that is not valid, answers
// 401; a valid credential outside its scope answers 403. Both answers are
// the same whatever the request names, so a client learns nothing of
// another tenant's commands or projections, nor whether they exist.

// guard reports whether p may make request r on set.
type guard func(p auth.Principal, r *http.Request, set *host.Set) bool

// open is the guard of the routes anyone may use (/healthz: a load
// balancer's probe).
var open guard = nil

// commandGuard: write on the tenant that owns the command type's
// category, or on one that grants p's tenant to dispatch it.
func commandGuard(p auth.Principal, r *http.Request, set *host.Set) bool {
	typ := r.PathValue("type")
	owner := ""
	if msg, ok := set.Message(typ); ok && msg.Kind == abi.MessageCommand {
		owner, _ = set.Owners().Owner(msg.Category)
	}
	return mayOrGranted(p, auth.Write, owner, func(reader string) bool {
		return set.Owners().Grants().CanDispatch(owner, reader, typ)
	})
}

// projectionGuard: read on the tenant of the module whose handler names
// the projection, or on one that tenant grants the projection to.
func projectionGuard(p auth.Principal, r *http.Request, set *host.Set) bool {
	name, owner := r.PathValue("name"), ""
	if route, ok := set.ProjectionRoute(name); ok {
		owner = route.Module.Tenant
	}
	return mayOrGranted(p, auth.Read, owner, func(reader string) bool {
		return set.Owners().Grants().CanReadProjection(owner, reader, name)
	})
}

// mayOrGranted reports whether p may do a for owner, or for a tenant
// owner grants it to (granted(tenant)). Nothing is owner-less but an
// admin's.
func mayOrGranted(p auth.Principal, a auth.Action, owner string, granted func(reader string) bool) bool {
	if p.May(a, owner) {
		return true
	}
	if owner == "" {
		return false
	}
	for _, t := range p.TenantsFor(a) {
		if granted(t) {
			return true
		}
	}
	return false
}

// adminGuard: the whole host's views (the status page, the plugins list,
// the metrics) are an admin's.
func adminGuard(p auth.Principal, _ *http.Request, _ *host.Set) bool {
	return p.May(auth.Administer, "")
}

type principalKey struct{}

// principalOf returns the principal route() authenticated for r; ok is
// false without keys.
func principalOf(ctx context.Context) (auth.Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(auth.Principal)
	return p, ok
}

// authMetrics count what the keys did: each key's last use, and the
// refusals by kind.
type authMetrics struct {
	lastUse *prometheus.GaugeVec
	refused *prometheus.CounterVec
}

func newAuthMetrics(reg prometheus.Registerer) *authMetrics {
	m := &authMetrics{
		lastUse: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "protean_auth_key_last_use_seconds",
			Help: "Unix time of each API key's last accepted use, by key id (the first 12 hex digits of its sha256), tenant and role."},
			[]string{"key", "tenant", "role"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "protean_auth_refusals_total",
			Help: "Requests refused by access control, by route and code (401: no or bad credential; 403: outside the credential's scope)."},
			[]string{"route", "code"}),
	}
	reg.MustRegister(m.lastUse, m.refused)
	return m
}

// admit authenticates r and checks g: it answers 401 or 403 itself and
// returns false, or returns r with the principal in its context.
func (a *api) admit(w http.ResponseWriter, r *http.Request, pattern string, g guard) (*http.Request, bool) {
	authn := a.auth.Load() // once: the request is checked against one set
	if !authn.Enabled() || g == nil {
		return r, true
	}
	p, err := authn.Authenticate(r.Context(), r.Header.Get("Authorization"))
	if err != nil {
		a.log.Info("http: unauthenticated request refused", "route", pattern, "why", err)
		a.authm.refused.WithLabelValues(pattern, "401").Inc()
		w.Header().Set("WWW-Authenticate", `Bearer realm="protean-host"`)
		writeError(w, http.StatusUnauthorized, "unauthorized: send Authorization: Bearer <API key>")
		return nil, false
	}
	if !g(p, r, a.e.Set()) {
		a.log.Info("http: request outside its credential's scope refused", "route", pattern, "credential", p.Key, "grants", p.Grants)
		a.refuse(w, pattern, "")
		return nil, false
	}
	if p.APIKey {
		g := p.Grants[0]
		a.authm.lastUse.WithLabelValues(p.Key, g.Tenant, string(g.Role)).Set(float64(time.Now().Unix()))
	}
	return r.WithContext(context.WithValue(r.Context(), principalKey{}, p)), true
}

// actor names who acts, for the audit (audit.Entry.Principal): "key:"
// and an API key's id, a token's "oidc:" and subject, or "anonymous"
// without credentials configured.
func actor(r *http.Request) string {
	if p, ok := principalOf(r.Context()); ok {
		if p.APIKey {
			return "key:" + p.Key
		}
		return p.Key
	}
	return "anonymous"
}

// refuse answers 403, the same whatever was refused and why (why is
// logged, if given), and counts it.
func (a *api) refuse(w http.ResponseWriter, pattern, why string) {
	if why != "" {
		a.log.Info("http: request outside its credential's scope refused", "route", pattern, "why", why)
	}
	a.authm.refused.WithLabelValues(pattern, "403").Inc()
	writeError(w, http.StatusForbidden, "forbidden: the credential does not allow this request")
}

// idempotencyScope is the scope of a command's Idempotency-Key: the
// command type, and with credentials the credential's tenants too, so one
// tenant's key never answers another's request.
func idempotencyScope(r *http.Request) string {
	typ := r.PathValue("type")
	if p, ok := principalOf(r.Context()); ok {
		if ts := p.Tenants(); len(ts) > 0 {
			return strings.Join(ts, ",") + "/" + typ
		}
	}
	return typ
}
