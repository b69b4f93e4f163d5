package main

import (
	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/deploy"
	"github.com/proteanhq/protean-host/internal/host"
)

// newDeployer builds what serves the deploy routes (package deploy): it
// changes the plugins directory and validates each change with the
// reloader, recording each action in the stores' audit log.
func newDeployer(c *composition, r *host.Reloader) *deploy.Deployer {
	return deploy.New(deploy.Options{Dir: c.cfg.Plugins.Dir, Reload: r.Reload, TenantOf: c.cfg.TenantName,
		Audit: c.st.audit, MaxModuleBytes: deployLimit(c.cfg), Now: c.clk.Now, Logger: c.log})
}

// deployLimit is the largest module any tenant may run: the HTTP bound of
// a deploy's body. The loader refuses a module over its own tenant's
// limit when the deploy reloads.
func deployLimit(cfg config.Config) int64 {
	n := cfg.ModuleLimits("").MaxModuleBytes
	for _, t := range cfg.Tenants {
		for _, m := range t.Modules {
			n = max(n, cfg.ModuleLimits(m).MaxModuleBytes)
		}
	}
	return n
}
