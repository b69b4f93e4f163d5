// Command shipping is the example module of the shipment aggregate: the
// command handler for ShipOrder, emitting OrderShipped on category
// "shipping" (stream shipping-{shipment_id}).
package main

import (
	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/pdk"
)

type ShipOrder struct {
	ShipmentID string `json:"shipment_id"`
	OrderID    string `json:"order_id"`
}

// OrderShipped carries order_id, the fulfillment process manager's
// partition key on category "shipping".
type OrderShipped struct {
	ShipmentID string `json:"shipment_id"`
	OrderID    string `json:"order_id"`
}

func init() {
	pdk.Module("shipping", "1.0.0")
	pdk.Command[ShipOrder]("ShipOrder", "shipping")
	pdk.Event[OrderShipped]("OrderShipped", "shipping")

	h := pdk.CommandHandler("shipping", "shipping")
	pdk.On(h, "ShipOrder", shipOrder)
}

func shipOrder(ctx *pdk.Context, cmd ShipOrder) error {
	if cmd.ShipmentID == "" || cmd.OrderID == "" {
		return pdk.Rejected("shipment_id and order_id are required")
	}
	var s ShipOrder
	v, err := ctx.Load(pdk.Aggregate, "shipping", cmd.ShipmentID, &s)
	if err != nil {
		return err
	}
	if v != 0 {
		return pdk.Rejected("shipment %s already exists", cmd.ShipmentID)
	}
	if err := ctx.Save(pdk.Aggregate, "shipping", cmd.ShipmentID, 0, cmd); err != nil {
		return err
	}
	return ctx.EmitExpecting("shipping-"+cmd.ShipmentID, "OrderShipped", OrderShipped(cmd), abi.NoStream)
}

func main() {}
