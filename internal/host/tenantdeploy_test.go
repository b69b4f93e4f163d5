package host_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// tenantLoader returns a loader whose modules belong to tenants by file
// name: a name starting "shop" or "orders" is tenant shop's, one
// containing "hijack" or "lab" tenant lab's, the others the default's.
func tenantLoader(t *testing.T) *host.Loader {
	t.Helper()
	of := func(module string) string {
		switch {
		case strings.HasPrefix(module, "shop"), module == "orders":
			return "shop"
		case strings.Contains(module, "hijack"), strings.Contains(module, "lab"):
			return "lab"
		}
		return ""
	}
	l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{}), CacheDir: wasmbuild.CacheDir(t),
		Tenancy: host.Tenancy{Of: of}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// Deploys per tenant are isolated (issue 21): one reload in which tenant
// shop's module goes bad (bytes that do not load; a version that loads
// but fails validation) and tenant lab's module gets a good new version
// applies lab's version, keeps shop's running version serving, and
// rejects shop's file, naming the file and its tenant.
func TestReloadIsolatesOneTenantsBadDeployFromAnothers(t *testing.T) {
	ctx := context.Background()
	l := tenantLoader(t)
	pm2 := wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", "variant=pm", "version=2.0.0")
	for _, tc := range []struct {
		name string
		bad  func(t *testing.T, dir string) // puts shop's bad orders.wasm
		want string                         // in the rejection's error
	}{
		{name: "bytes that do not load", want: "orders.wasm: not a WebAssembly module",
			bad: func(t *testing.T, dir string) {
				require.NoError(t, os.WriteFile(filepath.Join(dir, "orders.wasm.tmp"), []byte("junk"), 0o644))
				require.NoError(t, os.Rename(filepath.Join(dir, "orders.wasm.tmp"), filepath.Join(dir, "orders.wasm")))
			}},
		{name: "a module that fails validation", want: "handler orders",
			bad: func(t *testing.T, dir string) {
				replace(t, declared(t, "command_handler_missing_field"), dir, "orders.wasm") // sequential_by a field PlaceOrder lacks
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			wasmbuild.Copy(t, declared(t, "order_writer"), dir, "orders.wasm")
			wasmbuild.Copy(t, declared(t, "pm"), dir, "lab.wasm")
			running, errs := host.LoadSet(ctx, l, dir, inline)
			require.Empty(t, errs)
			t.Cleanup(func() { _ = running.Close(ctx) })
			require.Equal(t, "shop", module(running, "orders.wasm").Tenant)
			require.Equal(t, "lab", module(running, "lab.wasm").Tenant)
			applied := make(chan *host.Set, 1)
			r := host.NewReloader(host.ReloaderOptions{Loader: l, Dir: dir, Broker: inline, Running: running,
				Apply: func(s *host.Set) { applied <- s }})

			tc.bad(t, dir)
			replace(t, pm2, dir, "lab.wasm")
			out, errs := r.Reload(ctx)
			require.Equal(t, host.Partial, out, "%v", errs)
			next := testwait.Recv(t, "lab's version applied", applied)
			t.Cleanup(func() { _ = next.Close(ctx) })
			require.Equal(t, "2.0.0", module(next, "lab.wasm").Manifest.Module.Version, "lab's deploy is live")
			require.Same(t, module(running, "orders.wasm"), module(next, "orders.wasm"), "shop keeps its running version")
			_, ok := next.Command("PlaceOrder")
			require.True(t, ok, "shop's command still routes")

			st := r.Status()
			require.Len(t, st.Rejected, 1)
			rj := st.Rejected[0]
			require.Equal(t, "orders.wasm", rj.File)
			require.Equal(t, "shop", rj.Tenant, "the rejection names its tenant")
			require.Equal(t, fileSum(t, filepath.Join(dir, "orders.wasm")), rj.SHA256)
			require.Contains(t, rj.Error, tc.want)
			require.Len(t, errs, 1)
			require.Equal(t, "orders.wasm", host.ProblemFile(errs[0]))
		})
	}
}

// A category two tenants claim is refused to the claimant that does not
// own it: tenant shop runs orders.wasm, which writes category order; one
// reload adds tenant lab's module writing order too and a new version of
// orders.wasm. Shop's version goes live; lab's file is refused with a
// problem on its own file (not another's, held back for it) that names
// shop as owner, whether lab's file sorts before or after shop's.
func TestReloadRefusesTheTenantThatDoesNotOwnACategory(t *testing.T) {
	ctx := context.Background()
	l := tenantLoader(t)
	v2 := wasmbuild.Build(t, "./internal/host/testdata/plugins/declared", "variant=order_writer", "version=2.0.0")
	for _, hijack := range []string{"a_hijack.wasm", "z_hijack.wasm"} {
		t.Run(hijack, func(t *testing.T) {
			dir := t.TempDir()
			wasmbuild.Copy(t, declared(t, "order_writer"), dir, "orders.wasm")
			running, errs := host.LoadSet(ctx, l, dir, inline)
			require.Empty(t, errs)
			t.Cleanup(func() { _ = running.Close(ctx) })
			owner, _ := running.Owners().Owner("order")
			require.Equal(t, "shop", owner)
			applied := make(chan *host.Set, 1)
			r := host.NewReloader(host.ReloaderOptions{Loader: l, Dir: dir, Broker: inline, Running: running,
				Apply: func(s *host.Set) { applied <- s }})

			replace(t, declared(t, "order_hijacker"), dir, hijack)
			replace(t, v2, dir, "orders.wasm")
			out, errs := r.Reload(ctx)
			require.Equal(t, host.Partial, out, "%v", errs)
			next := testwait.Recv(t, "shop's version applied", applied)
			t.Cleanup(func() { _ = next.Close(ctx) })
			require.Equal(t, "2.0.0", module(next, "orders.wasm").Manifest.Module.Version, "the owner's change is live")
			require.Nil(t, module(next, hijack))
			owner, _ = next.Owners().Owner("order")
			require.Equal(t, "shop", owner)

			require.Len(t, errs, 1, "%v", errs)
			var p *host.Problem
			require.ErrorAs(t, errs[0], &p)
			var held *host.HeldError
			require.False(t, errors.As(errs[0], &held), "the problem is the claimant's own, not another file's: %v", errs[0])
			require.Equal(t, host.RuleTenant, p.Rule)
			require.Equal(t, hijack, p.File)
			require.Contains(t, p.Error(), "tenant lab claims category order, which tenant shop owns")
			require.Contains(t, p.Error(), hijack+" has command handler hijack on it")
			st := r.Status()
			require.Len(t, st.Rejected, 1)
			require.Equal(t, hijack, st.Rejected[0].File)
			require.Equal(t, "lab", st.Rejected[0].Tenant)
		})
	}
}
