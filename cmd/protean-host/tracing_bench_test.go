package main

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/telemetry"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// BenchmarkTracingCost runs two real hosts side by side (embedded: memory
// stores, inline broker; the orders and client_orders examples): one with
// tracing off, one with [telemetry] tracing on at 100 % sampling,
// exporting over OTLP/HTTP to a receiver on loopback that decodes every
// span. Clients place orders on one host, then the other, alternating, so
// both phases see the same machine. It reports each host's time per
// command (us_per_command_off, _on) and their ratio (x_on_off), and what
// the host's tracing calls cost with tracing off, measured in this process
// (no provider installed: OpenTelemetry's no-op spans; off_spans_ns, the
// three spans and two metadata writes of a command) and as a share of a
// command (off_share_pct). Run it with -benchtime=1x.
func BenchmarkTracingCost(b *testing.B) {
	recv, url, dir := tracedOrders(b)
	config := func(tracing string) string {
		return fmt.Sprintf("[plugins]\ndir = %q\ncache_dir = %q\ncache_max_mb = 0\n%s", dir, wasmbuild.CacheDir(b), tracing)
	}
	off := runHostEnv(b, config(""), "5s")
	on := runHostEnv(b, config(fmt.Sprintf("[telemetry]\ntracing = true\nendpoint = %q\n", url)), "5s")
	const clients, perPhase, rounds = 4, 400, 3
	n := 0
	phase := func(p *process) time.Duration {
		var wg sync.WaitGroup
		start := time.Now()
		for c := range clients {
			base := n
			wg.Go(func() {
				for i := range perPhase / clients {
					r, err := send("POST", "http://"+p.addr+"/v1/commands/PlaceOrder",
						fmt.Sprintf(`{"order_id":"o-%d-%d-%d","client_id":"c-%d","total":1}`, base, c, i, c))
					if err != nil || r.code != 200 {
						b.Errorf("PlaceOrder: %v %v", r, err)
						return
					}
				}
			})
		}
		wg.Wait()
		n++
		return time.Since(start)
	}
	phase(off) // the instances, the code, the connections
	phase(on)
	var tOff, tOn time.Duration
	for b.Loop() {
		for range rounds {
			tOff += phase(off)
			tOn += phase(on)
		}
	}
	per := func(d time.Duration) float64 {
		return float64(d.Microseconds()) / float64(b.N*rounds*perPhase)
	}
	require.NotEmpty(b, recv.find(func(s otlpSpan) bool { return s.name == "dispatch PlaceOrder" }), "the traced host exported its spans")

	// The tracing calls of one command, as the engine makes them, with no
	// provider installed.
	const loops = 200_000
	ctx := context.Background()
	began := time.Now()
	for range loops {
		var md abi.Metadata
		telemetry.Inject(ctx, &md)
		dctx, d := telemetry.Tracer().Start(ctx, "dispatch PlaceOrder")
		hctx, h := telemetry.Tracer().Start(dctx, "handle orders")
		h.End()
		_, c := telemetry.Tracer().Start(hctx, "commit")
		telemetry.Inject(dctx, &md)
		c.End()
		d.End()
	}
	spans := float64(time.Since(began).Nanoseconds()) / loops
	b.ReportMetric(per(tOff), "us_per_command_off")
	b.ReportMetric(per(tOn), "us_per_command_on")
	b.ReportMetric(per(tOn)/per(tOff), "x_on_off")
	b.ReportMetric(spans, "off_spans_ns")
	b.ReportMetric(100*spans/1000/per(tOff), "off_share_pct")
}
