package instrument_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/wazero"

	"github.com/proteanhq/protean-host/internal/instrument"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

func TestMain(m *testing.M) { testserver.Main(m, wasmbuild.Cleanup) }

// Every module the repository builds rewrites into a module wazero
// compiles, with the stop global exported and checks inserted.
func TestRewritesTheBuiltModules(t *testing.T) {
	pkgs := []string{"./plugins/examples/client_orders", "./plugins/examples/orders", "./plugins/examples/fulfillment",
		"./plugins/examples/payments", "./plugins/examples/shipping", "./internal/host/testdata/plugins/behave", "plugins/c/client_orders.c", "plugins/c/orders.c"}
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	for _, pkg := range pkgs {
		path := ""
		if strings.HasSuffix(pkg, ".c") {
			path = wasmbuild.BuildC(t, pkg)
		} else {
			path = wasmbuild.Build(t, pkg)
		}
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		res, err := instrument.Module(b, instrument.Limits{})
		require.NoError(t, err, pkg)
		require.Positive(t, res.Checks, pkg)
		cm, err := rt.CompileModule(ctx, res.Bytes)
		require.NoError(t, err, "%s: the rewritten module does not compile", pkg)
		require.Contains(t, cm.ExportedFunctions(), "protean_handle")
		t.Logf("%s: %d bytes -> %d, %d checks", pkg, len(b), len(res.Bytes), res.Checks)
		require.NoError(t, cm.Close(ctx))
	}
}
