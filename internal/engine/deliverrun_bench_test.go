package engine

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/groups"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// BenchmarkInlineDeliveryWASM (and BenchmarkRedisDeliveryWASM, the same
// on an unpartitioned Redis category) measures events per second through the
// inline broker's consumer with a trivial WASM projector (a Go guest that
// decodes each event and does nothing, deadline enforced), committing in
// the memory stores: batch=1 is one message per guest call (the baseline,
// as before runs), batch=64 hands the ready run in one call and reports
// its rate over batch=1's from the same run (x_batch1).
func BenchmarkInlineDeliveryWASM(b *testing.B) {
	benchDeliveryWASM(b, "inline", func(b *testing.B) runBroker {
		src, err := broker.NewInline(broker.DefaultOptions())
		require.NoError(b, err)
		return src
	})
}

// benchDeliveryWASM runs the delivery benchmark on the brokers newSrc
// returns, of the named provider: batch=1 against batch=64, same run.
func benchDeliveryWASM(b *testing.B, provider string, newSrc func(*testing.B) runBroker) {
	ctx := context.Background()
	l, err := host.NewLoader(host.LoaderOptions{CacheDir: wasmbuild.CacheDir(b)})
	require.NoError(b, err)
	b.Cleanup(func() { _ = l.Close(ctx) })
	dir := b.TempDir()
	wasmbuild.Copy(b, wasmbuild.Build(b, "./internal/host/testdata/plugins/declared", "variant=projector"), dir, "by_client.wasm")
	rate := map[int]float64{}
	for _, batch := range []int{1, 64} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			src := newSrc(b)
			b.Cleanup(func() { _ = src.Close() })
			// The broker's capabilities (Redis advertises partitioning, which
			// the projector's sequential_by asks for); the engine is not
			// Partitioned, so the category is consumed as an ordinary group.
			set, errs := host.LoadSet(ctx, l, dir, host.Broker{Name: "default", Provider: provider, Capabilities: src.Capabilities()})
			require.Empty(b, errs)
			mem := unitofwork.NewMemory()
			var handled atomic.Int64
			e := New(set, Options{Events: mem.Events, Records: mem.Records,
				UnitOfWork: unitofwork.New(mem, unitofwork.Options{Broker: "default"}),
				Handled:    func(Handled) { handled.Add(1) }})
			b.Cleanup(func() { _ = e.Stop(ctx) })
			n := b.N
			var msgs []delivery.Message
			for i := 0; i < n; i++ {
				key := "c" + strconv.Itoa(i%64)
				msgs = append(msgs, delivery.Message{ID: "m-" + strconv.Itoa(i), Stream: "order", Type: "OrderPlaced",
					Category: "order", EventStream: "order-o" + strconv.Itoa(i), GlobalPosition: int64(i + 1),
					Data: []byte(fmt.Sprintf(`{"order_id":"o%d","client_id":%q,"total":1.5}`, i, key))})
				if len(msgs) == 256 || i == n-1 {
					require.NoError(b, src.Publish(ctx, msgs...))
					msgs = msgs[:0]
				}
			}
			b.ResetTimer()
			start := time.Now()
			startGroups(b, e, src, groups.Options{Batch: batch})
			deadline := time.Now().Add(time.Minute)
			for {
				st, err := src.Stats(ctx, "order", "by_client")
				require.NoError(b, err)
				if handled.Load() >= int64(n) && st.Depth == 0 && st.InFlight == 0 && st.Requeued == 0 {
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("handled %d of %d: %+v", handled.Load(), n, st)
				}
				time.Sleep(100 * time.Microsecond)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			rate[batch] = float64(n) / elapsed.Seconds()
			b.ReportMetric(rate[batch], "msgs/s")
			if batch > 1 && rate[1] > 0 {
				b.ReportMetric(rate[batch]/rate[1], "x_batch1")
			}
		})
	}
}
