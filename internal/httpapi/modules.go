package httpapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/auth"
	"github.com/proteanhq/protean-host/internal/deploy"
	"github.com/proteanhq/protean-host/internal/host"
)

// Modules is what the deploy routes need (deploy.Deployer): the
// modules of the plugins directory, changed one validated reload at a
// time.
type Modules interface {
	// TenantOf returns the tenant of module name, for the routes' guard.
	TenantOf(name string) string
	List(ctx context.Context, tenants []string) ([]deploy.ModuleInfo, error)
	Put(ctx context.Context, principal, name string, wasm io.Reader) (deploy.Result, error)
	Remove(ctx context.Context, principal, name string) (deploy.Result, error)
	Rollback(ctx context.Context, principal, name string) (deploy.Result, error)
}

// The deploy routes: GET /v1/modules, and PUT, DELETE and POST .../rollback
// on /v1/modules/{name}.
var modulePatterns = []string{"GET /v1/modules", "PUT /v1/modules/{name}", "DELETE /v1/modules/{name}", "POST /v1/modules/{name}/rollback"}

// routeModules registers the deploy routes when Options.Modules is set;
// without it they answer 404 as any unknown path does.
func (a *api) routeModules(mux *muxes) {
	if a.modules == nil {
		for _, p := range []string{"/v1/modules", "/v1/modules/"} {
			mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
				writeError(w, http.StatusNotFound, "no route for "+r.Method+" "+r.URL.Path+": module deploys are not enabled")
			})
		}
		return
	}
	a.route(mux, modulePatterns[0], deployerGuard, a.listModules)
	a.route(mux, modulePatterns[1], a.moduleGuard, a.putModule)
	a.route(mux, modulePatterns[2], a.moduleGuard, a.removeModule)
	a.route(mux, modulePatterns[3], a.moduleGuard, a.rollbackModule)
}

// moduleMethods returns the methods a deploy route's path takes, or "".
func moduleMethods(parts []string) string {
	if len(parts) < 2 || parts[0] != "v1" || parts[1] != "modules" {
		return ""
	}
	switch {
	case len(parts) == 2:
		return http.MethodGet
	case len(parts) == 3:
		return http.MethodPut + ", " + http.MethodDelete
	case len(parts) == 4 && parts[3] == "rollback":
		return http.MethodPost
	}
	return ""
}

// deployerGuard: deploy on some tenant (an admin's on all).
func deployerGuard(p auth.Principal, _ *http.Request, _ *host.Set) bool {
	return p.May(auth.Administer, "") || len(p.TenantsFor(auth.Deploy)) > 0
}

// moduleGuard: deploy on the module's tenant (by the config, whether the
// module exists or not).
func (a *api) moduleGuard(p auth.Principal, r *http.Request, _ *host.Set) bool {
	return p.May(auth.Deploy, a.modules.TenantOf(r.PathValue("name")))
}

func (a *api) listModules(w http.ResponseWriter, r *http.Request) {
	var tenants []string // all
	if p, ok := principalOf(r.Context()); ok && !p.May(auth.Administer, "") {
		tenants = p.TenantsFor(auth.Deploy)
	}
	mods, err := a.modules.List(r.Context(), tenants)
	if err != nil {
		a.log.Error("http: listing modules", "error", err)
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"modules": mods})
}

func (a *api) putModule(w http.ResponseWriter, r *http.Request) {
	// The body is read within the body timeout; the reload that follows
	// is not bounded by it.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(a.bodyTimeout))
	body := &deadlineClearing{r: r.Body, rc: rc}
	res, err := a.modules.Put(r.Context(), actor(r), r.PathValue("name"), body)
	_ = rc.SetReadDeadline(time.Time{})
	if errors.Is(err, os.ErrDeadlineExceeded) {
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusRequestTimeout, "request body not read within "+a.bodyTimeout.String())
		return
	}
	if errors.Is(err, deploy.ErrTooLarge) {
		w.Header().Set("Connection", "close") // the rest of the body is not read
	}
	a.answerDeploy(w, r, res, err)
}

// deadlineClearing clears the read deadline once the body is read, so
// the server's background read does not end the request's context
// while the reload runs.
type deadlineClearing struct {
	r  io.Reader
	rc *http.ResponseController
}

func (d *deadlineClearing) Read(p []byte) (int, error) {
	n, err := d.r.Read(p)
	if err != nil {
		_ = d.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

func (a *api) removeModule(w http.ResponseWriter, r *http.Request) {
	res, err := a.modules.Remove(r.Context(), actor(r), r.PathValue("name"))
	a.answerDeploy(w, r, res, err)
}

func (a *api) rollbackModule(w http.ResponseWriter, r *http.Request) {
	res, err := a.modules.Rollback(r.Context(), actor(r), r.PathValue("name"))
	a.answerDeploy(w, r, res, err)
}

// answerDeploy answers a deploy action: 200 with the module, or the
// error's status; a rejected deploy answers 422 with the reload's
// problems, each naming its file.
func (a *api) answerDeploy(w http.ResponseWriter, r *http.Request, res deploy.Result, err error) {
	if err == nil {
		writeJSON(w, http.StatusOK, res)
		return
	}
	var rej *deploy.RejectedError
	if errors.As(err, &rej) {
		problems := make([]host.FileProblem, 0, len(rej.Problems))
		for _, p := range rej.Problems {
			problems = append(problems, host.FileProblem{File: host.ProblemFile(p), Error: abi.Clip(p.Error(), MaxErrorBytes)})
		}
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"error": abi.Clip(err.Error(), MaxErrorBytes), "outcome": rej.Outcome, "problems": problems})
		return
	}
	code := deployStatus(err)
	if code >= 500 {
		a.log.Error("http: deploy failed", "route", r.Pattern, "module", r.PathValue("name"), "error", err)
	}
	writeError(w, code, err.Error())
}

// deployStatus maps a deploy error to its HTTP status.
func deployStatus(err error) int {
	switch {
	case errors.Is(err, deploy.ErrInvalidName), errors.Is(err, deploy.ErrRead):
		return http.StatusBadRequest
	case errors.Is(err, deploy.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, deploy.ErrNoHistory), errors.Is(err, deploy.ErrNotRegular):
		return http.StatusConflict
	case errors.Is(err, deploy.ErrTooLarge):
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusInternalServerError
}
