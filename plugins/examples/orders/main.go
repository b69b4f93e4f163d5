// Command orders is the example module of the order aggregate: the command
// handler for PlaceOrder and CancelOrder, emitting OrderPlaced and
// OrderCancelled on category "order" (stream order-{order_id}).
package main

import (
	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/pdk"
)

type PlaceOrder struct {
	OrderID  string  `json:"order_id"`
	ClientID string  `json:"client_id"`
	Total    float64 `json:"total"`
}

type CancelOrder struct {
	OrderID string `json:"order_id"`
}

type OrderPlaced struct {
	OrderID  string  `json:"order_id"`
	ClientID string  `json:"client_id"`
	Total    float64 `json:"total"`
}

// OrderCancelled carries client_id because category "order" is partitioned
// by it: every event of a partitioned category must carry the key.
type OrderCancelled struct {
	OrderID  string `json:"order_id"`
	ClientID string `json:"client_id"`
}

// Order is the aggregate's state.
type Order struct {
	OrderID  string  `json:"order_id"`
	ClientID string  `json:"client_id"`
	Total    float64 `json:"total"`
	Status   string  `json:"status"`
}

func init() {
	pdk.Module("orders", "1.0.0")
	pdk.Command[PlaceOrder]("PlaceOrder", "order")
	pdk.Command[CancelOrder]("CancelOrder", "order")
	pdk.Event[OrderPlaced]("OrderPlaced", "order")
	pdk.Event[OrderCancelled]("OrderCancelled", "order")

	h := pdk.CommandHandler("orders", "order")
	pdk.On(h, "PlaceOrder", placeOrder)
	pdk.On(h, "CancelOrder", cancelOrder)
}

func placeOrder(ctx *pdk.Context, cmd PlaceOrder) error {
	if cmd.OrderID == "" {
		return pdk.Rejected("order_id is required")
	}
	if cmd.Total < 0 {
		return pdk.Rejected("total %v must not be negative", cmd.Total)
	}
	var o Order
	v, err := ctx.Load(pdk.Aggregate, "order", cmd.OrderID, &o)
	if err != nil {
		return err
	}
	if v != 0 {
		return pdk.Rejected("order %s already exists", cmd.OrderID)
	}
	o = Order{OrderID: cmd.OrderID, ClientID: cmd.ClientID, Total: cmd.Total, Status: "placed"}
	if err := ctx.Save(pdk.Aggregate, "order", cmd.OrderID, v, o); err != nil {
		return err
	}
	return ctx.EmitExpecting("order-"+cmd.OrderID, "OrderPlaced",
		OrderPlaced{OrderID: o.OrderID, ClientID: o.ClientID, Total: o.Total}, abi.NoStream)
}

func cancelOrder(ctx *pdk.Context, cmd CancelOrder) error {
	var o Order
	v, err := ctx.Load(pdk.Aggregate, "order", cmd.OrderID, &o)
	if err != nil {
		return err
	}
	switch {
	case v == 0:
		return pdk.Rejected("order %s does not exist", cmd.OrderID)
	case o.Status == "cancelled":
		return pdk.Rejected("order %s is already cancelled", cmd.OrderID)
	}
	o.Status = "cancelled"
	if err := ctx.Save(pdk.Aggregate, "order", cmd.OrderID, v, o); err != nil {
		return err
	}
	return ctx.Emit("order-"+cmd.OrderID, "OrderCancelled", OrderCancelled{OrderID: o.OrderID, ClientID: o.ClientID})
}

func main() {}
