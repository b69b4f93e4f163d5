package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/auth"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/ops"
)

// The operations API (package ops) under /v1/ops: an operator's view of
// and actions on its tenants' partitions, event-store subscriptions,
// outbox rows and dead letters, and the audit log. The route admits any credential that
// may operate some tenant (an operator's, an admin's); the Service then
// keeps each answer to the caller's tenants, and an action on another
// tenant's target, or on one that does not exist, answers the same 403
// as access control does.

// opsGuard admits a principal that may operate some tenant.
func opsGuard(p auth.Principal, _ *http.Request, _ *host.Set) bool {
	return p.May(auth.Administer, "") || len(p.TenantsFor(auth.Operate)) > 0
}

// auditGuard admits a principal that may operate or deploy some tenant:
// each reads the audit entries of its tenants.
func auditGuard(p auth.Principal, r *http.Request, s *host.Set) bool {
	return opsGuard(p, r, s) || len(p.TenantsFor(auth.Deploy)) > 0
}

// scopeOf is the tenants in which the request's principal may do one of
// actions (auth.Operate if none): every one without credentials (a
// loopback-only host) or for an admin.
func scopeOf(r *http.Request, actions ...auth.Action) ops.Scope {
	p, ok := principalOf(r.Context())
	if !ok || p.May(auth.Administer, "") {
		return ops.All()
	}
	if len(actions) == 0 {
		actions = []auth.Action{auth.Operate}
	}
	var ts []string
	for _, a := range actions {
		ts = append(ts, p.TenantsFor(a)...)
	}
	return ops.Tenants(ts...)
}

// routeOps registers the operations routes, if the host has a Service.
func (a *api) routeOps(mux *muxes, o ops.API) {
	if o == nil {
		return
	}
	list := func(f func(ctx context.Context, sc ops.Scope, r *http.Request) (any, error)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			v, err := f(r.Context(), scopeOf(r), r)
			if err != nil {
				a.opsError(w, r, err)
				return
			}
			writeJSON(w, http.StatusOK, v)
		}
	}
	act := func(f func(ctx context.Context, sc ops.Scope, act ops.Act, group string, r *http.Request) (ops.Done, error)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			body, ok := a.readBody(w, r)
			if !ok {
				return
			}
			var req struct {
				Group  string `json:"group"`
				Reason string `json:"reason"`
			}
			if len(body) > 0 {
				if err := json.Unmarshal(body, &req); err != nil {
					writeError(w, http.StatusBadRequest, "request body must be a JSON object with optional \"group\" and \"reason\" strings")
					return
				}
			}
			d, err := f(r.Context(), scopeOf(r), ops.Act{Action: r.PathValue("action"), By: actor(r), Reason: req.Reason}, req.Group, r)
			if err != nil {
				a.opsError(w, r, err)
				return
			}
			writeJSON(w, http.StatusOK, d)
		}
	}
	a.route(mux, "GET /v1/ops/partitions", opsGuard, list(func(ctx context.Context, sc ops.Scope, _ *http.Request) (any, error) {
		return o.Partitions(ctx, sc)
	}))
	a.route(mux, "GET /v1/ops/partitions/{category}/{key}", opsGuard, list(func(ctx context.Context, sc ops.Scope, r *http.Request) (any, error) {
		return o.Partition(ctx, sc, r.PathValue("category"), r.PathValue("key"))
	}))
	a.route(mux, "POST /v1/ops/partitions/{category}/{key}/{action}", opsGuard, act(func(ctx context.Context, sc ops.Scope, act ops.Act, group string, r *http.Request) (ops.Done, error) {
		return o.ActOnPartition(ctx, sc, act, r.PathValue("category"), r.PathValue("key"), group)
	}))
	a.route(mux, "GET /v1/ops/subscriptions", opsGuard, list(func(ctx context.Context, sc ops.Scope, _ *http.Request) (any, error) {
		return o.Subscriptions(ctx, sc)
	}))
	a.route(mux, "GET /v1/ops/subscriptions/failures", opsGuard, list(func(ctx context.Context, sc ops.Scope, r *http.Request) (any, error) {
		all, err := boolQuery(r, "all")
		if err != nil {
			return nil, err
		}
		return o.Failures(ctx, sc, all)
	}))
	a.route(mux, "POST /v1/ops/subscriptions/{group}/{unit}/{position}/{action}", opsGuard, act(func(ctx context.Context, sc ops.Scope, act ops.Act, _ string, r *http.Request) (ops.Done, error) {
		pos, err := strconv.ParseInt(r.PathValue("position"), 10, 64)
		if err != nil || pos <= 0 {
			return ops.Done{}, fmt.Errorf("%w: POSITION must be a global position > 0", ops.ErrInvalid)
		}
		return o.ActOnFailure(ctx, sc, act, r.PathValue("group"), r.PathValue("unit"), pos)
	}))
	a.route(mux, "GET /v1/ops/outbox", opsGuard, list(func(ctx context.Context, sc ops.Scope, _ *http.Request) (any, error) {
		return o.Outbox(ctx, sc)
	}))
	a.route(mux, "POST /v1/ops/outbox/{id}/{action}", opsGuard, act(func(ctx context.Context, sc ops.Scope, act ops.Act, _ string, r *http.Request) (ops.Done, error) {
		id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
		if err != nil || id <= 0 {
			return ops.Done{}, fmt.Errorf("%w: an outbox row's ID is an integer > 0", ops.ErrInvalid)
		}
		return o.ActOnOutbox(ctx, sc, act, id)
	}))
	a.route(mux, "GET /v1/ops/dead-letters", opsGuard, list(func(ctx context.Context, sc ops.Scope, _ *http.Request) (any, error) {
		return o.DeadLetters(ctx, sc)
	}))
	a.route(mux, "POST /v1/ops/dead-letters/{stream}/{group}/{id}/replay", opsGuard, act(func(ctx context.Context, sc ops.Scope, act ops.Act, _ string, r *http.Request) (ops.Done, error) {
		act.Action = "replay"
		return o.ReplayDeadLetter(ctx, sc, act, r.PathValue("stream"), r.PathValue("group"), r.PathValue("id"))
	}))
	a.route(mux, "GET /v1/ops/audit", auditGuard, list(func(ctx context.Context, _ ops.Scope, r *http.Request) (any, error) {
		sc := scopeOf(r, auth.Operate, auth.Deploy)
		var q audit.Query
		for name, v := range map[string]*int64{"before": &q.Before} {
			if s := r.URL.Query().Get(name); s != "" {
				n, err := strconv.ParseInt(s, 10, 64)
				if err != nil || n <= 0 {
					return nil, fmt.Errorf("%w: %s must be an audit entry id > 0", ops.ErrInvalid, name)
				}
				*v = n
			}
		}
		if s := r.URL.Query().Get("limit"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("%w: limit must be an integer > 0 (at most %d)", ops.ErrInvalid, audit.MaxLimit)
			}
			q.Limit = n
		}
		return o.Audit(ctx, sc, q)
	}))
}

// boolQuery reads the query parameter name as a boolean ("" is false).
func boolQuery(r *http.Request, name string) (bool, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, fmt.Errorf("%w: %s must be true or false", ops.ErrInvalid, name)
	}
	return b, nil
}

// opsError answers an operation's error: 403 (the access-control answer)
// for a target outside the caller's scope, 404, 409, 400, and 500 for
// the rest.
func (a *api) opsError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, ops.ErrForbidden):
		a.refuse(w, r.Pattern, "the target is outside the credential's tenants")
	case errors.Is(err, ops.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, ops.ErrConflict):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, ops.ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	default:
		a.log.Error("operation failed", "route", r.Pattern, "error", err)
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

// opsAllowed returns the method an /v1/ops path (its parts after "ops")
// takes, or "".
func opsAllowed(parts []string) string {
	switch {
	case len(parts) == 1 && (parts[0] == "partitions" || parts[0] == "subscriptions" || parts[0] == "outbox" || parts[0] == "audit" || parts[0] == "dead-letters"),
		len(parts) == 3 && parts[0] == "partitions",
		len(parts) == 2 && parts[0] == "subscriptions" && parts[1] == "failures":
		return http.MethodGet
	case len(parts) == 4 && parts[0] == "partitions",
		len(parts) == 5 && parts[0] == "subscriptions",
		len(parts) == 3 && parts[0] == "outbox",
		len(parts) == 5 && parts[0] == "dead-letters" && parts[4] == "replay":
		return http.MethodPost
	}
	return ""
}
