package main

import (
	"errors"
	"fmt"

	"github.com/proteanhq/protean-host/internal/auth"
	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/host"
)

// reloadAuth re-reads the config file on SIGHUP and makes its [http.auth]
// the API's credentials, swapped whole (auth.Live): a request in flight
// finishes with the set it loaded. Nothing else of the file is applied;
// the other sections take a restart, and the log line says so. A file
// that does not load or validate, or credentials that would leave a
// non-loopback listener open to anyone, leave the running credentials in
// force, and the log says why: a reload never falls back to no auth by
// mistake.
func (h *hostProcess) reloadAuth(e *env) {
	if h.auth == nil {
		return // the API was never built
	}
	prev := h.auth.Load()
	next, a, err := loadAuth(e, prev)
	if err != nil {
		e.log.Error("SIGHUP: credentials not reloaded; the running ones stay", "config", e.configPath, "error", err)
		return
	}
	h.auth.Store(next)
	added, removed := auth.KeyChanges(prev, next)
	e.log.Info("SIGHUP: credentials reloaded from [http.auth] (other config sections take a restart)", "config", e.configPath,
		"api_keys", len(next.KeyIDs()), "oidc_issuer", a.OIDC.Issuer, "keys_added", added, "keys_removed", removed)
	if prev.Enabled() && !next.Enabled() {
		e.log.Warn("SIGHUP: [http.auth] has no credentials now: every request on the loopback listener is let through",
			"listen", e.cfg.HTTP.Listen)
	}
}

// loadAuth reads the config file at e.configPath and builds its
// credentials, checked against the running config (e.cfg, after its
// flags): each key's tenant must be one the host runs, and no credentials
// on a non-loopback listener needs http.auth.allow_unauthenticated, as
// at start (config.HTTP.CheckExposure).
func loadAuth(e *env, prev *auth.Authenticator) (*auth.Authenticator, config.HTTPAuth, error) {
	if e.configPath == "" {
		return nil, config.HTTPAuth{}, errors.New("the host was started without a config file: nothing to reload")
	}
	if err := e.checkConfigFile(); err != nil {
		return nil, config.HTTPAuth{}, err
	}
	cfg, err := config.Load(e.configPath)
	if err != nil {
		return nil, config.HTTPAuth{}, err
	}
	a := cfg.HTTP.Auth
	for i, k := range a.Keys {
		if _, ok := e.cfg.Tenants[k.Tenant]; k.Tenant != "" && k.Tenant != host.DefaultTenant && !ok {
			return nil, a, fmt.Errorf("http.auth.keys: key %d: tenant %q is not one the host runs (tenants take a restart)", i, k.Tenant)
		}
	}
	running := e.cfg.HTTP
	running.Auth = a
	if err := running.CheckExposure(); err != nil {
		return nil, a, fmt.Errorf("refused, as at start: %w", err)
	}
	next, err := newAuthenticator(a, prev)
	if err != nil {
		return nil, a, err
	}
	return next, a, nil
}
