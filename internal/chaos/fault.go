package chaos

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"

	"github.com/proteanhq/protean-host/internal/faultproxy"
)

// do injects one fault and undoes it (restarts, resumes) before it
// returns; an error means the harness could not undo it.
func (r *runner) do(ctx context.Context, f Fault) error {
	switch f.Kind {
	case HostKill:
		h := r.owner(ctx)
		r.notef("  %s: host %d (owns %d)", f.Kind, h.Index, h.Owned(ctx))
		if err := h.Kill(); err != nil {
			return err
		}
		hold(ctx, f.Hold)
		return h.Start(ctx)
	case HostStop:
		h := r.owner(ctx)
		r.notef("  %s: host %d (owns %d)", f.Kind, h.Index, h.Owned(ctx))
		if err := h.Signal(syscall.SIGSTOP); err != nil {
			return err
		}
		hold(ctx, f.Hold)
		return h.Signal(syscall.SIGCONT)
	case RollingRestart:
		for _, h := range r.hosts {
			if err := h.Stop(); err != nil {
				return err
			}
			if err := h.Start(ctx); err != nil {
				return err
			}
		}
		return nil
	case HotReload:
		return r.reload(ctx)
	case RedisKill, RedisDown:
		if err := r.redis.Kill(); err != nil {
			return err
		}
		hold(ctx, f.Hold)
		return r.redis.Start(ctx)
	case PGDown:
		return r.pg.Down(ctx, f.Hold)
	case RedisShutdown:
		if err := r.redis.ShutdownNoSave(ctx); err != nil {
			return err
		}
		hold(ctx, f.Hold)
		return r.redis.Start(ctx)
	case RedisEmpty:
		if err := r.redis.Kill(); err != nil {
			return err
		}
		if err := r.redis.Wipe(); err != nil {
			return err
		}
		hold(ctx, f.Hold)
		return r.redis.Start(ctx)
	case PGFast:
		return r.pg.Restart(ctx, "fast")
	case PGImmediate:
		return r.pg.Restart(ctx, "immediate")
	case CutPG, CutRedis:
		ps := r.proxies(f)
		for _, p := range ps {
			p.Cut()
		}
		hold(ctx, f.Hold)
		for _, p := range ps {
			p.Resume()
		}
		return nil
	case StallPGUp, StallPGDown, StallRedisUp, StallRedisDown:
		dir := faultproxy.Upstream
		if f.Kind == StallPGDown || f.Kind == StallRedisDown {
			dir = faultproxy.Downstream
		}
		ps := r.proxies(f)
		for _, p := range ps {
			p.Stall(dir)
		}
		hold(ctx, f.Hold)
		for _, p := range ps {
			p.Resume()
		}
		return nil
	}
	return fmt.Errorf("unknown fault kind %q", f.Kind)
}

// proxies are the proxies a cut or stall acts on.
func (r *runner) proxies(f Fault) []*faultproxy.Proxy {
	all := r.pgProxies
	if f.Kind.target() == "redis" {
		all = r.redisProxies
	}
	if f.Hosts == nil {
		return all
	}
	var out []*faultproxy.Proxy
	for _, i := range f.Hosts {
		out = append(out, all[i])
	}
	return out
}

// owner is the live host owning the most partitions (the lowest index on
// a tie), so that killing or stopping it moves leases.
func (r *runner) owner(ctx context.Context) *Host {
	best, n := r.hosts[0], -2
	for _, h := range r.hosts {
		if o := h.Owned(ctx); o > n {
			best, n = h, o
		}
	}
	return best
}

// reload puts the other build of client_orders.wasm into every host's
// plugins directory (through a rename), sends SIGHUP, and waits until
// every host runs it.
func (r *runner) reload(ctx context.Context) error {
	r.reloads++
	src, want := r.variant, r.variantVersion
	if r.reloads%2 == 0 {
		src, want = filepath.Join(r.o.Plugins, reloadModule), r.baseVersion
	}
	r.notef("  %s: client_orders %s on every host", HotReload, want)
	for _, h := range r.hosts {
		if err := copyFile(src, filepath.Join(h.pluginsDir, reloadModule)); err != nil {
			return err
		}
		if err := h.Signal(syscall.SIGHUP); err != nil {
			return err
		}
	}
	for _, h := range r.hosts {
		if err := until(ctx, serverBound, fmt.Sprintf("host %d runs client_orders %s", h.Index, want), func() (bool, string) {
			v := h.ModuleVersion(ctx, reloadModule)
			return v == want, "running " + v
		}); err != nil {
			return err
		}
	}
	return nil
}
