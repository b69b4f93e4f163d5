package host_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// BenchmarkNoisyNeighbour measures a quiet tenant's call (a batch of 20
// "ok" messages, one caller) alone, and beside a noisy tenant whose 3
// modules run CPU-bound calls ("loop") to their 200 ms deadline from 4
// callers each, without the share (guest_concurrency = -1, the baseline)
// and with it (the defaults). Run it with -benchtime=1x; it reports p50
// and p99 in ms per case.
func BenchmarkNoisyNeighbour(b *testing.B) {
	src := wasmbuild.Build(b, "./internal/host/testdata/plugins/behave")
	dir := b.TempDir()
	for _, n := range []string{"quiet", "noisy1", "noisy2", "noisy3"} {
		wasmbuild.Copy(b, src, dir, n+".wasm")
	}
	tenancy := host.Tenancy{Of: func(m string) string {
		if strings.HasPrefix(m, "noisy") {
			return "noisy"
		}
		return "quiet"
	}}
	limits := func(m string) host.Limits {
		if strings.HasPrefix(m, "noisy") {
			return generous(host.Limits{Timeout: 200 * time.Millisecond})
		}
		return generous(host.Limits{})
	}
	batch := ops(slices.Repeat([]string{"ok"}, 20)...)
	for b.Loop() {
		for _, c := range []struct {
			name       string
			concurrent int
			shares     map[string]host.ShareOptions
		}{{"unshared", -1, nil}, {"shared", 0, nil}, {"shared-noisy-max1", 0, map[string]host.ShareOptions{"noisy": {MaxConcurrency: 1}}}} {
			l, err := host.NewLoader(host.LoaderOptions{Limits: generous(host.Limits{}), TenantLimits: limits, Tenancy: tenancy,
				GuestConcurrency: c.concurrent, Shares: c.shares, CacheDir: wasmbuild.CacheDir(b)})
			require.NoError(b, err)
			mods, errs := l.LoadDir(context.Background(), dir)
			require.Empty(b, errs)
			quiet := mods[slices.IndexFunc(mods, func(m *host.Module) bool { return m.File == "quiet.wasm" })]
			_, err = quiet.Handle(context.Background(), "behave", batch, &memSession{}) // its instance
			require.NoError(b, err)
			measure := func(label string) {
				var lat []time.Duration
				for range 400 {
					start := time.Now()
					_, err := quiet.Handle(context.Background(), "behave", batch, &memSession{})
					require.NoError(b, err)
					lat = append(lat, time.Since(start))
				}
				slices.Sort(lat)
				p50, p90, p99 := lat[len(lat)/2], lat[len(lat)*9/10], lat[len(lat)*99/100]
				b.ReportMetric(float64(p50.Microseconds())/1000, c.name+"/"+label+"-p50-ms")
				b.ReportMetric(float64(p99.Microseconds())/1000, c.name+"/"+label+"-p99-ms")
				fmt.Printf("%s %s: p50 %v p90 %v p99 %v max %v\n", c.name, label, p50, p90, p99, lat[len(lat)-1])
			}
			measure("alone")
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			for _, m := range mods {
				if m.Tenant != "noisy" {
					continue
				}
				for range 4 {
					wg.Go(func() {
						for ctx.Err() == nil {
							_, _ = m.Handle(ctx, "behave", ops("loop"), &memSession{})
						}
					})
				}
			}
			time.Sleep(300 * time.Millisecond) // let the noisy calls fill the cores
			measure("noisy")
			if sched := l.Scheduler(); sched != nil {
				for _, st := range sched.Stats() {
					fmt.Printf("%s %s: calls %d gave up %d, wait %.1f s in all\n", c.name, st.Tenant, st.Calls, st.GaveUp, st.WaitSeconds)
				}
			}
			cancel()
			wg.Wait()
			for _, m := range mods {
				_ = m.Close(context.Background())
			}
			_ = l.Close(context.Background())
		}
	}
}
