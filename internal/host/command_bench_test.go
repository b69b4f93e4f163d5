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

// emptySession finds no aggregate: every PlaceOrder is a new order.
type emptySession struct{}

func (emptySession) Load(context.Context, *abi.LoadRequest) abi.LoadResponse {
	return abi.LoadResponse{}
}

func (emptySession) ReadStream(context.Context, *abi.ReadStreamRequest, int) abi.ReadStreamResponse {
	return abi.ReadStreamResponse{}
}

type placeOrder struct {
	OrderID  string  `json:"order_id"`
	ClientID string  `json:"client_id"`
	Total    float64 `json:"total"`
}

type order struct {
	OrderID  string  `json:"order_id"`
	ClientID string  `json:"client_id"`
	Total    float64 `json:"total"`
	Status   string  `json:"status"`
}

// BenchmarkCommandHandler is the per-command cost of the example command
// handler (plugins/examples/orders, PlaceOrder: load the aggregate, save
// it, emit OrderPlaced) as native Go (the baseline, first, in the same
// run) and as the Go guest: with the module's own JSON codecs
// (plugins/examples/orders/codec.go) and without them (build tag
// reflectjson: encoding/json's reflection), with the deadline enforced
// (instrumented, the default), and with codecs and no deadline; and the
// same handler in C (plugins/c/orders.c, deadline instrumented). x_native
// and x_native_cpu as in BenchmarkProjector.
func BenchmarkCommandHandler(b *testing.B) {
	load := func(wasm string, lim host.Limits) *host.Module {
		l, err := host.NewLoader(host.LoaderOptions{CacheDir: wasmbuild.CacheDir(b), Limits: lim})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = l.Close(context.Background()) })
		m, err := l.LoadFile(context.Background(), wasmbuild.Copy(b, wasm, b.TempDir(), "orders.wasm"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = m.Close(context.Background()) })
		return m
	}
	codecs := wasmbuild.Build(b, "./plugins/examples/orders")
	reflection := wasmbuild.BuildTagged(b, "./plugins/examples/orders", "reflectjson")
	guests := []struct {
		name string
		m    *host.Module
	}{
		{"go_v2", load(codecs, host.Limits{})},
		{"go_v2_reflectjson", load(reflection, host.Limits{})},
		{"go_v2_uninterruptible", load(codecs, host.Limits{Uninterruptible: true})},
		{"c_v2", load(wasmbuild.BuildC(b, "plugins/c/orders.c"), host.Limits{})},
	}
	cmd := func(i int) []abi.Envelope {
		data, _ := json.Marshal(placeOrder{OrderID: fmt.Sprintf("o-%d", i), ClientID: "c-1", Total: 42.5})
		return []abi.Envelope{{ID: fmt.Sprintf("c-%d", i), Type: "PlaceOrder", Data: data}}
	}
	i := 0
	next := func() []abi.Envelope { i++; return cmd(i) }
	var native perUnit
	b.Run("native", func(b *testing.B) {
		native = measure(b, 1, "op", perUnit{}, func() { nativePlaceOrder(b, next()) })
	})
	s := emptySession{}
	for _, g := range guests {
		b.Run(g.name, func(b *testing.B) {
			measure(b, 1, "op", native, func() {
				res, err := g.m.Handle(context.Background(), "orders", next(), s)
				if err != nil || len(res) != 1 || res[0].Error != nil || res[0].Effects == nil || len(res[0].Effects.Events) != 1 {
					b.Fatalf("%v %+v", err, res)
				}
			})
		})
	}
}

// nativePlaceOrder is PlaceOrder in plain Go: decode the command, build
// the aggregate and the event, encode both.
func nativePlaceOrder(b *testing.B, batch []abi.Envelope) {
	var c placeOrder
	if err := json.Unmarshal(batch[0].Data, &c); err != nil {
		b.Fatal(err)
	}
	o := order{OrderID: c.OrderID, ClientID: c.ClientID, Total: c.Total, Status: "placed"}
	state, err := json.Marshal(o)
	if err != nil {
		b.Fatal(err)
	}
	ev, err := json.Marshal(placeOrder(c))
	if err != nil {
		b.Fatal(err)
	}
	if len(state) == 0 || len(ev) == 0 {
		b.Fatal("nothing encoded")
	}
}
