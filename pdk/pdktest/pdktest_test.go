package pdktest_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/pdk"
	"github.com/proteanhq/protean-host/pdk/pdktest"
)

// The module under test: a command handler and a projector, as an author
// would write them.

type PlaceOrder struct {
	OrderID  string  `json:"order_id"`
	ClientID string  `json:"client_id"`
	Total    float64 `json:"total"`
}

type OrderPlaced PlaceOrder

type Order struct {
	ClientID string  `json:"client_id"`
	Total    float64 `json:"total"`
}

type ClientOrders struct {
	Orders int      `json:"orders"`
	IDs    []string `json:"ids"`
	// Seen is how many events the order's stream held when projected
	// (read through ReadStream).
	Seen int `json:"seen"`
}

type Notify struct {
	ClientID string `json:"client_id"`
}

func init() {
	pdk.Module("shop", "0.1.0")
	pdk.Command[PlaceOrder]("PlaceOrder", "order")
	pdk.Event[OrderPlaced]("OrderPlaced", "order")
	pdk.Command[Notify]("Notify", "client")
	pdk.On(pdk.CommandHandler("orders", "order"), "PlaceOrder", placeOrder)
	pdk.On(pdk.Projector("client_orders", "order").SequentialBy("client_id"), "OrderPlaced", project)
}

func placeOrder(ctx *pdk.Context, cmd PlaceOrder) error {
	switch cmd.OrderID {
	case "boom":
		panic("kaboom")
	case "bad-stream":
		return ctx.Emit("no dash", "OrderPlaced", OrderPlaced(cmd))
	}
	var o Order
	v, err := ctx.Load(pdk.Aggregate, "order", cmd.OrderID, &o)
	if err != nil {
		return err
	}
	if v > 0 {
		return pdk.Rejected("order %s exists", cmd.OrderID)
	}
	ctx.Log("info", "placing "+cmd.OrderID)
	if err := ctx.Save(pdk.Aggregate, "order", cmd.OrderID, v, Order{ClientID: cmd.ClientID, Total: cmd.Total}); err != nil {
		return err
	}
	if err := ctx.Dispatch("Notify", Notify{ClientID: cmd.ClientID}); err != nil {
		return err
	}
	return ctx.EmitExpecting("order-"+cmd.OrderID, "OrderPlaced", OrderPlaced(cmd), abi.NoStream)
}

func project(ctx *pdk.Context, ev OrderPlaced) error {
	var doc ClientOrders
	v, err := ctx.Load(pdk.Projection, "client_orders", ev.ClientID, &doc)
	if err != nil {
		return err
	}
	evs, err := ctx.ReadStream(ctx.Message().Stream, 0, 0)
	if err != nil {
		return err
	}
	doc.Orders++
	doc.IDs = append(doc.IDs, ev.OrderID)
	doc.Seen = len(evs)
	return ctx.Save(pdk.Projection, "client_orders", ev.ClientID, v, doc)
}

func TestCommandAppliesEffects(t *testing.T) {
	h := pdktest.New(t)
	res := h.Command("PlaceOrder", PlaceOrder{OrderID: "o-1", ClientID: "c-1", Total: 42})
	require.NoError(t, res.Err)
	require.Equal(t, "orders", res.Handler)
	require.Len(t, res.Events, 1)
	ev := res.Events[0]
	require.Equal(t, "OrderPlaced", ev.Type)
	require.Equal(t, "order-o-1", ev.Stream)
	require.Equal(t, int64(0), ev.Position)
	require.Equal(t, int64(1), ev.GlobalPosition)
	require.JSONEq(t, `{"order_id":"o-1","client_id":"c-1","total":42}`, string(ev.Data))
	require.Equal(t, []abi.NewCommand{{Type: "Notify", Data: json.RawMessage(`{"client_id":"c-1"}`)}}, res.Commands())
	require.Len(t, res.Writes(), 1)

	var o Order
	require.Equal(t, int64(1), h.Load(pdk.Aggregate, "order", "o-1", &o))
	require.Equal(t, Order{ClientID: "c-1", Total: 42}, o)
	require.Len(t, h.Stream("order-o-1"), 1)
	require.Equal(t, []string{"info: placing o-1"}, h.Logs())

	// The handler sees the committed aggregate: a second order o-1 is
	// refused, and nothing of it is applied.
	res = h.Command("PlaceOrder", PlaceOrder{OrderID: "o-1", ClientID: "c-2", Total: 1})
	require.Equal(t, abi.ErrorRejected, res.Kind(), "%v", res.Err)
	require.ErrorContains(t, res.Err, "order o-1 exists")
	require.Nil(t, res.Effects)
	require.Equal(t, int64(1), h.Load(pdk.Aggregate, "order", "o-1", &o))
	require.Len(t, h.Stream("order-o-1"), 1)
}

func TestEventReachesProjector(t *testing.T) {
	h := pdktest.New(t)
	h.Append("order-o-1", "Unrelated", map[string]int{"n": 1})
	results := h.Event("order-o-1", "OrderPlaced", OrderPlaced{OrderID: "o-1", ClientID: "c-1", Total: 1})
	require.Len(t, results, 1)
	require.NoError(t, results[0].Err)
	require.Equal(t, "client_orders", results[0].Handler)
	h.Event("order-o-2", "OrderPlaced", OrderPlaced{OrderID: "o-2", ClientID: "c-1", Total: 2})

	var doc ClientOrders
	require.Equal(t, int64(2), h.Load(pdk.Projection, "client_orders", "c-1", &doc))
	require.Equal(t, ClientOrders{Orders: 2, IDs: []string{"o-1", "o-2"}, Seen: 1}, doc)
	require.Equal(t, 2, len(h.Stream("order-o-1")), "the event handed to the projector is stored")

	require.Empty(t, h.Event("order-o-3", "Unrelated", map[string]int{}), "no handler handles it")
}

// Effects apply all or nothing: an append that expects a new stream onto
// an existing one fails the message transiently, and its record write is
// not applied either.
func TestConflictAppliesNothing(t *testing.T) {
	h := pdktest.New(t)
	h.Append("order-o-1", "OrderPlaced", OrderPlaced{OrderID: "o-1"})
	res := h.Command("PlaceOrder", PlaceOrder{OrderID: "o-1", ClientID: "c-1"})
	require.Equal(t, abi.ErrorTransient, res.Kind())
	require.True(t, errors.Is(res.Err, pdktest.ErrConflict), "%v", res.Err)
	require.Equal(t, int64(0), h.Load(pdk.Aggregate, "order", "o-1", nil))

	// Put seeds committed state the handler sees.
	h.Put(pdk.Aggregate, "order", "o-2", Order{ClientID: "c-9"})
	res = h.Command("PlaceOrder", PlaceOrder{OrderID: "o-2", ClientID: "c-1"})
	require.Equal(t, abi.ErrorRejected, res.Kind())
}

// What the host would refuse fails here too: an output the ABI's checks
// reject, and a panic, fail the message permanently.
func TestFailuresArePermanent(t *testing.T) {
	h := pdktest.New(t)
	res := h.Command("PlaceOrder", PlaceOrder{OrderID: "bad-stream"})
	require.Equal(t, abi.ErrorPermanent, res.Kind())
	require.ErrorIs(t, res.Err, abi.ErrResponse)
	require.Empty(t, h.Stream("no dash"))

	res = h.Command("PlaceOrder", PlaceOrder{OrderID: "boom"})
	require.Equal(t, abi.ErrorPermanent, res.Kind())
	require.True(t, strings.Contains(res.Err.Error(), "kaboom"), "%v", res.Err)

}

// A command whose fields do not match the declaration is refused before
// the handler runs, as the host refuses it (422).
func TestCommandInputChecked(t *testing.T) {
	h := pdktest.New(t)
	for _, body := range []string{
		`{"order_id": 5, "client_id": "c-1", "total": 1}`,
		`{"order_id": "o-1", "client_id": "c-1", "total": 1, "extra": true}`,
		`{"order_id": "o-1", "total": 1}`,
	} {
		res := h.Command("PlaceOrder", json.RawMessage(body))
		require.Equal(t, abi.ErrorRejected, res.Kind(), body)
		require.ErrorIs(t, res.Err, abi.ErrInput, body)
	}
	require.Empty(t, h.Logs(), "the handler never ran")
}

func TestManifest(t *testing.T) {
	m := pdktest.New(t).Manifest()
	require.Equal(t, "shop", m.Module.Name)
	require.Len(t, m.Handlers, 2)
}
