package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// BenchmarkNoisyNeighbourHTTP runs the real host (embedded, GOMAXPROCS=2)
// with two tenants: shop (the example orders module) and noisy (three
// burn modules, whose one command spins until its 200 ms deadline stops
// it). One client places orders one after another, first alone, then
// while 4 clients per burn module flood its command. It reports the
// order's p50 and p99 in each phase, and the p99 beside the noise over
// the p99 alone, for the host without the fair share
// (guest_concurrency = -1), with its defaults, and with the noisy tenant
// at max_concurrency = 1. Run it with -benchtime=1x.
func BenchmarkNoisyNeighbourHTTP(b *testing.B) {
	dir := b.TempDir()
	wasmbuild.Copy(b, filepath.Join(wasmbuild.Examples(b), "orders.wasm"), dir, "orders.wasm")
	for _, n := range []string{"1", "2", "3"} {
		wasmbuild.Copy(b, wasmbuild.Build(b, "./internal/host/testdata/plugins/burn", "n="+n), dir, "burn"+n+".wasm")
	}
	const orders = 1000
	for b.Loop() {
		for _, c := range []struct{ name, plugins, noisy string }{
			{"unshared", "guest_concurrency = -1", ""},
			{"shared", "", ""},
			{"shared-noisy-max1", "", "max_concurrency = 1"},
		} {
			p := runHostEnv(b, fmt.Sprintf(`
[plugins]
dir = %q
cache_dir = %q
cache_max_mb = 0
%s
[tenants.shop]
modules = ["orders"]
[tenants.noisy]
modules = ["burn1", "burn2", "burn3"]
timeout_ms = 200
%s
`, dir, wasmbuild.CacheDir(b), c.plugins, c.noisy), "2s", "GOMAXPROCS=2")
			base := "http://" + p.addr
			testwait.For(b, "the host compiled its modules", func() (bool, string) {
				r, err := send("GET", base+"/healthz", "")
				return err == nil && strings.Contains(r.String(), `"ok"`), fmt.Sprintf("%v %v", r, err)
			})
			i := 0
			place := func() []time.Duration {
				lat := make([]time.Duration, 0, orders)
				for range orders {
					i++
					start := time.Now()
					r, err := send("POST", base+"/v1/commands/PlaceOrder", fmt.Sprintf(`{"order_id":"o-%d","client_id":"c-1","total":1}`, i))
					lat = append(lat, time.Since(start))
					require.NoError(b, err)
					require.Equal(b, 200, r.code, r.String())
				}
				slices.Sort(lat)
				return lat
			}
			place() // the instance, the code, the caches
			alone := place()

			stop := make(chan struct{})
			var wg sync.WaitGroup
			var burns, unexpected int
			var mu sync.Mutex
			for _, n := range []string{"1", "2", "3"} {
				for k := range 4 {
					wg.Go(func() {
						for j := 0; ; j++ {
							select {
							case <-stop:
								return
							default:
							}
							r, err := send("POST", base+"/v1/commands/Burn"+n, fmt.Sprintf(`{"id":"b-%d-%d"}`, k, j))
							mu.Lock()
							burns++
							if err != nil || r.code == 200 {
								unexpected++ // a burn never succeeds: it runs to its deadline
							}
							mu.Unlock()
						}
					})
				}
			}
			time.Sleep(500 * time.Millisecond) // let the burns fill the cores
			noisy := place()
			close(stop)
			wg.Wait()
			p.kill()

			pct := func(lat []time.Duration, q int) float64 { return float64(lat[len(lat)*q/100].Microseconds()) / 1000 }
			b.ReportMetric(pct(alone, 50), c.name+"/alone-p50-ms")
			b.ReportMetric(pct(alone, 99), c.name+"/alone-p99-ms")
			b.ReportMetric(pct(noisy, 50), c.name+"/noisy-p50-ms")
			b.ReportMetric(pct(noisy, 99), c.name+"/noisy-p99-ms")
			b.ReportMetric(pct(noisy, 99)/pct(alone, 99), c.name+"/p99-noisy/alone")
			fmt.Printf("%s: orders alone p50 %.1f p99 %.1f ms; beside %d burns (%d not a deadline error) p50 %.1f p99 %.1f max %.1f ms; p99 %.2fx\n",
				c.name, pct(alone, 50), pct(alone, 99), burns, unexpected, pct(noisy, 50), pct(noisy, 99),
				float64(noisy[len(noisy)-1].Microseconds())/1000, pct(noisy, 99)/pct(alone, 99))
		}
	}
}
