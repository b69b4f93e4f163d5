package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

type placed struct {
	OrderID  string  `json:"order_id"`
	ClientID string  `json:"client_id"`
	Total    float64 `json:"total"`
}

type clientOrders struct {
	ClientID string   `json:"client_id"`
	Orders   int      `json:"orders"`
	Total    float64  `json:"total"`
	OrderIDs []string `json:"order_ids"`
}

// docSession serves the projector's document.
type docSession struct{ doc json.RawMessage }

func (s *docSession) Load(context.Context, *abi.LoadRequest) abi.LoadResponse {
	return abi.LoadResponse{Found: true, Version: 3, Data: s.doc}
}

func (s *docSession) ReadStream(context.Context, *abi.ReadStreamRequest, int) abi.ReadStreamResponse {
	return abi.ReadStreamResponse{}
}

func events(n int) []abi.Envelope {
	out := make([]abi.Envelope, n)
	for i := range out {
		data, _ := json.Marshal(placed{OrderID: fmt.Sprintf("o-%d", i), ClientID: "c-1", Total: 42.5})
		out[i] = abi.Envelope{ID: fmt.Sprintf("e-%d", i), Type: "OrderPlaced", Stream: fmt.Sprintf("order-o-%d", i), Data: data}
	}
	return out
}

var startDoc = json.RawMessage(`{"client_id":"c-1","orders":2,"total":85,"order_ids":["a","b"]}`)

// BenchmarkProjector is the Done-when figure of issue 10: the per-event
// cost of the example projector as native Go (the baseline, first, in the
// same run), as the Go guest on ABI v2 and on ABI v1, and as the C guest
// (plugins/c, ABI v2), each with the deadline enforced (the default
// limits: the module instrumented, internal/instrument), and the Go v2 guest
// without it (interruptible = false) and with wazero's
// close-on-context-done (the fallback deadline) for reference; batch 1
// and batch 50. x_native is each guest's ns/event over native's;
// x_native_cpu the same in the process's CPU time (user and system),
// which a machine shared with other work disturbs less than the wall
// clock.
func BenchmarkProjector(b *testing.B) {
	l, err := host.NewLoader(host.LoaderOptions{CacheDir: wasmbuild.CacheDir(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(context.Background())
	trusted, err := host.NewLoader(host.LoaderOptions{CacheDir: wasmbuild.CacheDir(b), Limits: host.Limits{Uninterruptible: true}})
	if err != nil {
		b.Fatal(err)
	}
	defer trusted.Close(context.Background())
	runtimeDeadline, err := host.NewLoader(host.LoaderOptions{CacheDir: wasmbuild.CacheDir(b), Limits: host.Limits{RuntimeDeadline: true}})
	if err != nil {
		b.Fatal(err)
	}
	defer runtimeDeadline.Close(context.Background())
	load := func(l *host.Loader, path string) *host.Module {
		m, err := l.LoadFile(context.Background(), wasmbuild.Copy(b, path, b.TempDir(), "client_orders.wasm"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = m.Close(context.Background()) })
		return m
	}
	goV2 := wasmbuild.Build(b, "./plugins/examples/client_orders")
	guests := []struct {
		name string
		m    *host.Module
	}{
		{"go_v2", load(l, goV2)},
		{"c_v2", load(l, wasmbuild.BuildC(b, "plugins/c/client_orders.c"))},
		{"go_v1", load(l, wasmbuild.Build(b, "./plugins/examples/client_orders", wasmbuild.ABIv1))},
		{"go_v2_uninterruptible", load(trusted, goV2)},
		{"go_v2_runtime_deadline", load(runtimeDeadline, goV2)},
	}
	s := &docSession{doc: startDoc}
	for _, n := range []int{1, 50} {
		batch := events(n)
		var native perUnit
		b.Run(fmt.Sprintf("batch=%d/native", n), func(b *testing.B) {
			native = measure(b, n, "event", perUnit{}, func() { nativeProjector(b, batch) })
		})
		for _, g := range guests {
			b.Run(fmt.Sprintf("batch=%d/%s", n, g.name), func(b *testing.B) {
				measure(b, n, "event", native, func() {
					res, err := g.m.Handle(context.Background(), "client_orders", batch, s)
					if err != nil || len(res) != n || res[0].Error != nil {
						b.Fatalf("%v %+v", err, res)
					}
				})
			})
		}
	}
}

// perUnit is a benchmark's wall-clock and CPU (user and system) time per
// unit of work, in ns.
type perUnit struct{ wall, cpu float64 }

// measure runs body b.N times, each one n units, and reports ns/unit and
// cpu-ns/unit, and x_native and x_native_cpu, each over the baseline's
// (when it is set: the baseline runs first in the same run).
func measure(b *testing.B, n int, unit string, baseline perUnit, body func()) perUnit {
	b.ReportAllocs()
	cpu0 := cpuTime()
	for b.Loop() {
		body()
	}
	m := perUnit{
		wall: float64(b.Elapsed().Nanoseconds()) / float64(b.N*n),
		cpu:  float64(cpuTime()-cpu0) / float64(b.N*n),
	}
	b.ReportMetric(m.wall, "ns/"+unit)
	b.ReportMetric(m.cpu, "cpu-ns/"+unit)
	if baseline.wall > 0 {
		b.ReportMetric(m.wall/baseline.wall, "x_native")
	}
	if baseline.cpu > 0 {
		b.ReportMetric(m.cpu/baseline.cpu, "x_native_cpu")
	}
	return m
}

// nativeProjector is client_orders in plain Go: decode each event, update
// the document loaded once per batch, encode it per event.
func nativeProjector(b *testing.B, batch []abi.Envelope) {
	var doc clientOrders
	if err := json.Unmarshal(startDoc, &doc); err != nil {
		b.Fatal(err)
	}
	writes := make([]abi.Write, 0, len(batch))
	for _, env := range batch {
		var ev placed
		if err := json.Unmarshal(env.Data, &ev); err != nil {
			b.Fatal(err)
		}
		doc.Orders++
		doc.Total += ev.Total
		doc.OrderIDs = append(doc.OrderIDs, ev.OrderID)
		data, err := json.Marshal(doc)
		if err != nil {
			b.Fatal(err)
		}
		writes = append(writes, abi.Write{Kind: abi.RecordProjection, Type: "client_orders", ID: ev.ClientID, Data: data})
	}
	if len(writes) != len(batch) {
		b.Fatal("lost writes")
	}
}
