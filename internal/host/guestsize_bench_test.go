package host

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// noOrderSession answers orders that its order does not exist yet.
type noOrderSession struct{}

func (noOrderSession) Load(context.Context, *abi.LoadRequest) abi.LoadResponse {
	return abi.LoadResponse{}
}

func (noOrderSession) ReadStream(context.Context, *abi.ReadStreamRequest, int) abi.ReadStreamResponse {
	return abi.ReadStreamResponse{}
}

var placeOrder = []abi.Envelope{{ID: "c-1", Type: "PlaceOrder", Stream: "order-o-1",
	Data: json.RawMessage(`{"order_id":"o-1","client_id":"c-1","total":42.5}`)}}

// guestExample is one example module and a call it answers.
type guestExample struct {
	name, pkg, handler string
	msgs               []abi.Envelope
	session            Session
}

var guestExamples = []guestExample{
	{"client_orders", "./plugins/examples/client_orders", "client_orders", orderPlaced, orderSession{}},
	{"orders", "./plugins/examples/orders", "orders", placeOrder, noOrderSession{}},
}

// BenchmarkGuestSize measures what one Go guest instance holds, and what
// its calls cost, for builds of the example modules that differ only in
// the Go runtime's settings (issue 21, item 7), all in one run so that
// they compare. Run it once:
//
//	go test ./internal/host/ -run '^$' -bench GuestSize -benchtime 1x
//
// For each build and example, K=8 instances of one module (default
// limits: memory_mb 64, recycle_above_mb 32) each take one call, then N
// more. lin1_MB and linN_MB are an instance's linear memories (the
// module's and the Extism kernel's, as the instance's memory meter counts
// them) after the first call and after N+1; rss1_MB and rssN_MB the
// process's RSS growth per instance at the same points (after a GC that
// returns freed host memory to the OS), which counts only the pages the
// guest touched plus the instance's host-side structures; call_us the
// mean of the N calls (GC pauses and memory growth included), cpu_us the
// process's CPU time per call, slow_calls and slow_us the calls over 2 ms
// per instance and their time per call. steady: one warm instance of each
// build (past its N+1 calls), the builds taking turns, so that a change of
// the machine's load slows them alike; V_us is build V's mean call and
// x_V its time over the first build's. GUESTSIZE_VARIANTS (a
// comma-separated list of pdk.gcPercent values, "" for the kit's default;
// e.g. ",1000,100": GOGC 200, 1000 and 100)
// and GUESTSIZE_N choose the builds and N.
func BenchmarkGuestSize(bench *testing.B) {
	if testing.Short() {
		bench.Skip("builds and runs several modules")
	}
	variants := []string{""}
	if v, ok := os.LookupEnv("GUESTSIZE_VARIANTS"); ok {
		variants = strings.Split(v, ",")
	}
	n := 3000
	if v := os.Getenv("GUESTSIZE_N"); v != "" {
		_, _ = fmt.Sscan(v, &n)
	}
	const k = 8
	l, err := NewLoader(LoaderOptions{Limits: Limits{InstanceIdle: time.Hour}, Instances: k, CacheDir: wasmbuild.CacheDir(bench)})
	if err != nil {
		bench.Fatal(err)
	}
	defer l.Close(context.Background())
	for _, ex := range guestExamples {
		calls := make([]func() time.Duration, len(variants))
		for i, v := range variants {
			name := v
			if name == "" {
				name = "default"
			}
			bench.Run(ex.name+"/"+name, func(b *testing.B) {
				var vars []string
				if v != "" {
					vars = append(vars, "github.com/proteanhq/protean-host/pdk.gcPercent="+v)
				}
				path := wasmbuild.Build(b, ex.pkg, vars...)
				m, err := l.LoadFile(context.Background(), wasmbuild.Copy(b, path, b.TempDir(), ex.name+".wasm"))
				if err != nil {
					b.Fatal(err)
				}
				bench.Cleanup(func() { _ = m.Close(context.Background()) })
				call := func() time.Duration {
					start := time.Now()
					res, err := m.Handle(context.Background(), ex.handler, ex.msgs, ex.session)
					d := time.Since(start)
					if err != nil || len(res) != 1 || res[0].Error != nil {
						b.Fatalf("%v %+v", err, res)
					}
					return d
				}
				// take moves the idle instance the last call left out of
				// the pool, so that the next call makes a new one; give
				// puts one back as the only idle instance.
				take := func() *instance {
					m.pool.mu.Lock()
					defer m.pool.mu.Unlock()
					if len(m.pool.idle) != 1 {
						b.Fatalf("%d idle instances", len(m.pool.idle))
					}
					in := m.pool.idle[0].inst
					m.pool.idle = m.pool.idle[:0]
					return in
				}
				give := func(in *instance) {
					m.pool.mu.Lock()
					m.pool.idle = append(m.pool.idle, idleInstance{inst: in, since: time.Now()})
					m.pool.mu.Unlock()
				}
				lin := func(ins []*instance) float64 {
					var sum uint64
					for _, in := range ins {
						sum += in.mem.used.Load()
					}
					return float64(sum) / float64(len(ins)) / (1 << 20)
				}
				call() // the module's first instance, kept in the pool: not counted
				base := rssMB(b)
				ins := make([]*instance, 0, k)
				for range k {
					call()
					ins = append(ins, take())
				}
				rss1 := rssMB(b)
				lin1 := lin(ins)
				var total time.Duration
				times := make([]time.Duration, 0, k*n)
				cpu0 := cpuNanos()
				for _, in := range ins {
					give(in)
					for range n {
						d := call()
						total += d
						times = append(times, d)
					}
					take()
				}
				cpu := cpuNanos() - cpu0
				slices.Sort(times)
				var slow int
				var slowSum time.Duration
				for _, d := range times {
					if d > 2*time.Millisecond {
						slow++
						slowSum += d
					}
				}
				rssN := rssMB(b)
				linN := lin(ins)
				for _, in := range ins {
					give(in)
				}
				calls[i] = call
				b.ReportMetric(lin1, "lin1_MB")
				b.ReportMetric(linN, "linN_MB")
				b.ReportMetric((rss1-base)/k, "rss1_MB")
				b.ReportMetric((rssN-base)/k, "rssN_MB")
				b.ReportMetric(float64(total.Nanoseconds())/float64(k*n)/1000, "call_us")
				b.ReportMetric(float64(cpu)/float64(k*n)/1000, "cpu_us")
				b.ReportMetric(float64(times[len(times)/2].Nanoseconds())/1000, "p50_us")
				b.ReportMetric(float64(times[len(times)*99/100].Nanoseconds())/1000, "p99_us")
				b.ReportMetric(float64(times[len(times)-1].Nanoseconds())/1000, "max_us")
				b.ReportMetric(float64(slow)/k, "slow_calls")
				b.ReportMetric(float64(slowSum.Nanoseconds())/float64(k*n)/1000, "slow_us")
			})
		}
		// steady: the same warm instance of each build (past its first N
		// calls), the builds taking turns of n/5 calls, 10 turns each, so
		// that a machine whose load changes slows them alike.
		bench.Run(ex.name+"/steady", func(b *testing.B) {
			sum := make([]time.Duration, len(variants))
			for range 10 {
				for i, call := range calls {
					for range n / 5 {
						sum[i] += call()
					}
				}
			}
			for i, v := range variants {
				if v == "" {
					v = "default"
				}
				us := float64(sum[i].Nanoseconds()) / float64(10*(n/5)) / 1000
				b.ReportMetric(us, strings.ReplaceAll(v, ":", "_")+"_us")
				b.ReportMetric(float64(sum[i])/float64(sum[0]), "x_"+strings.ReplaceAll(v, ":", "_"))
			}
		})
	}
}

// cpuNanos is the process's CPU time (user and system) in nanoseconds.
func cpuNanos() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
