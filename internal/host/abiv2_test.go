package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// load loads the module built from pkg with vars through the shared
// loader.
func loadBuilt(t *testing.T, pkg string, vars ...string) *host.Module {
	t.Helper()
	m, err := sharedLoader(t).LoadFile(context.Background(), wasmbuild.Build(t, pkg, vars...))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m
}

// The same sources built for ABI v1 and for ABI v2 load side by side in
// one set, validate together, and give the same results for the same
// batches: v2 changes the wire, not the meaning.
func TestABIv1AndV2SideBySide(t *testing.T) {
	v1 := loadBuilt(t, "./internal/host/testdata/plugins/behave", wasmbuild.ABIv1)
	v2 := loadBuilt(t, "./internal/host/testdata/plugins/behave")
	require.Equal(t, 1, v1.Manifest.ABIVersion)
	require.Equal(t, 2, v2.Manifest.ABIVersion)

	// One set: the v1 examples with a v2 client_orders.
	dir := wasmbuild.Examples(t, wasmbuild.ABIv1)
	wasmbuild.Copy(t, wasmbuild.Build(t, "./plugins/examples/client_orders"), dir, "client_orders.wasm")
	mods, errs := sharedLoader(t).LoadDir(context.Background(), dir)
	require.Empty(t, errs)
	var ds []host.Declared
	versions := map[string]int{}
	for _, m := range mods {
		ds = append(ds, host.Declared{File: m.File, Manifest: m.Manifest})
		versions[m.File] = m.Manifest.ABIVersion
		defer m.Close(context.Background())
	}
	require.Equal(t, map[string]int{"client_orders.wasm": 2, "fulfillment.wasm": 1, "orders.wasm": 1, "payments.wasm": 1, "shipping.wasm": 1}, versions)
	_, problems := host.Validate(ds, inline)
	require.Empty(t, problems)

	ctx := context.Background()
	batches := [][]abi.Envelope{
		ops("ok", "load", "load", "read"),
		ops("ok", "transient", "ok"),
		ops("load", "rejected"),
		ops("panic"),
	}
	for i, batch := range batches {
		s := func() *memSession {
			return &memSession{records: map[string]abi.LoadResponse{"behave/d": {Found: true, Version: 4, Data: json.RawMessage(`{"seen": ["before"]}`)}}}
		}
		s1, s2 := s(), s()
		r1, err := v1.Handle(ctx, "behave", batch, s1)
		require.NoError(t, err, "batch %d", i)
		r2, err := v2.Handle(ctx, "behave", batch, s2)
		require.NoError(t, err, "batch %d", i)
		require.Equal(t, results(t, r1), results(t, r2), "batch %d: v1 and v2 differ", i)
		require.Equal(t, s1.loads, s2.loads, "batch %d", i)
	}

	// The example projector, v1 against v2, on a batch of 50.
	co1 := loadBuilt(t, "./plugins/examples/client_orders", wasmbuild.ABIv1)
	co2 := loadBuilt(t, "./plugins/examples/client_orders")
	batch := events(50)
	r1, err := co1.Handle(ctx, "client_orders", batch, &docSession{doc: startDoc})
	require.NoError(t, err)
	r2, err := co2.Handle(ctx, "client_orders", batch, &docSession{doc: startDoc})
	require.NoError(t, err)
	require.Len(t, r2, 50)
	require.Equal(t, results(t, r1), results(t, r2))
	var last clientOrders
	require.NoError(t, json.Unmarshal(r2[49].Effects.Writes[0].Data, &last))
	require.Equal(t, 52, last.Orders)
	require.Equal(t, int64(3+49), r2[49].Effects.Writes[0].ExpectedVersion, "each event sees the batch's earlier writes")
}

// results renders results comparably (json.RawMessage compacted).
func results(t *testing.T, rs []abi.Result) string {
	t.Helper()
	b, err := json.Marshal(rs)
	require.NoError(t, err)
	return string(b)
}

// A v2 module that hands the host functions pointers or lengths outside
// its memory fails its call with a *GuestMemoryError naming the function,
// an output over the limit is refused before it is copied, and the module
// keeps serving afterwards.
func TestABIv2WildPointers(t *testing.T) {
	ctx := context.Background()
	ping := []abi.Envelope{{ID: "1", Type: "Ping", Stream: "ping-1", Data: json.RawMessage(`{"id":"1"}`)}}
	ok := loadBuilt(t, "./internal/host/testdata/plugins/rawv2", "variant=ok")
	res, err := ok.Handle(ctx, "pinger", ping, &memSession{})
	require.NoError(t, err)
	require.Len(t, res, 1)

	for _, tc := range []struct {
		variant, function string
	}{
		{"wild_input", abi.V2InputRead},
		{"wild_output", abi.V2Output},
		{"wild_load_request", abi.V2Load},
		{"wild_load_buffer", abi.V2Load},
		{"wild_read_stream", abi.V2ReadStream},
		{"wild_response", abi.V2Response},
		{"wild_log", abi.V2Log},
		{"wild_error", abi.V2Error},
	} {
		t.Run(tc.variant, func(t *testing.T) {
			m := loadBuilt(t, "./internal/host/testdata/plugins/rawv2", "variant="+tc.variant)
			for range 2 { // and again, on a fresh instance
				_, err := m.Handle(ctx, "pinger", ping, &memSession{})
				require.ErrorIs(t, err, host.ErrGuestMemory)
				var me *host.GuestMemoryError
				require.ErrorAs(t, err, &me)
				require.Equal(t, tc.function, me.Function)
				var ce *host.CallError
				require.ErrorAs(t, err, &ce)
				require.Contains(t, err.Error(), fmt.Sprintf("plugin %s: handler pinger: guest memory access out of bounds: %s(", m.File, tc.function))
			}
		})
	}
	t.Run("huge_output", func(t *testing.T) {
		m := loadBuilt(t, "./internal/host/testdata/plugins/rawv2", "variant=huge_output")
		_, err := m.Handle(ctx, "pinger", ping, &memSession{})
		require.ErrorIs(t, err, host.ErrOutput)
		require.ErrorContains(t, err, "output of 2147483647 bytes exceeds the 16777216-byte limit (max_output_bytes)")
	})
	t.Run("huge_load_request", func(t *testing.T) {
		m := loadBuilt(t, "./internal/host/testdata/plugins/rawv2", "variant=huge_load_request")
		res, err := m.Handle(ctx, "pinger", ping, &memSession{})
		require.NoError(t, err, "an oversized request is answered as invalid, not read")
		require.Len(t, res, 1)
	})
}
