package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/host"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// BenchmarkHandleWASM runs the client_orders example projector on
// OrderPlaced events through the sandbox (JSON in, host-function load,
// JSON out), one event per call and 50 per call. BenchmarkHandleNative is
// its baseline in the same run: the same decode, load, update and encode
// in plain Go. Compare ns per event.

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

func (s *docSession) ReadStream(context.Context, *abi.ReadStreamRequest) abi.ReadStreamResponse {
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

func BenchmarkHandleWASM(b *testing.B) { benchHandle(b, false) }

// BenchmarkHandleWASMUninterruptible is the same without deadline
// enforcement ([plugins.limits] interruptible = false, trusted modules).
func BenchmarkHandleWASMUninterruptible(b *testing.B) { benchHandle(b, true) }

func benchHandle(b *testing.B, uninterruptible bool) {
	l, err := host.NewLoader(host.LoaderOptions{CacheDir: wasmbuild.CacheDir(b), Limits: host.Limits{Uninterruptible: uninterruptible}})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(context.Background())
	m, err := l.LoadFile(context.Background(), wasmbuild.Copy(b, wasmbuild.Build(b, "./plugins/examples/client_orders"), b.TempDir(), "client_orders.wasm"))
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close(context.Background())
	s := &docSession{doc: startDoc}
	for _, n := range []int{1, 50} {
		batch := events(n)
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				res, err := m.Handle(context.Background(), "client_orders", batch, s)
				if err != nil || len(res) != n || res[0].Error != nil {
					b.Fatalf("%v %+v", err, res)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
		})
	}
}

func BenchmarkHandleNative(b *testing.B) {
	for _, n := range []int{1, 50} {
		batch := events(n)
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var doc clientOrders
				if err := json.Unmarshal(startDoc, &doc); err != nil {
					b.Fatal(err)
				}
				writes := make([]abi.Write, 0, n)
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
				if len(writes) != n {
					b.Fatal("lost writes")
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
		})
	}
}
