// Command fulfillment is the example process manager: an order is fulfilled
// once it is both paid and shipped, whichever comes first. It correlates by
// order_id across categories "payment" and "shipping", and with
// sequential_by = true no two events of one order run at once.
package main

import "github.com/proteanhq/protean-host/pdk"

type PaymentRecorded struct {
	PaymentID string  `json:"payment_id"`
	OrderID   string  `json:"order_id"`
	Amount    float64 `json:"amount"`
}

type OrderShipped struct {
	ShipmentID string `json:"shipment_id"`
	OrderID    string `json:"order_id"`
}

// Fulfillment is both the process state and the projection document
// (id = order_id).
type Fulfillment struct {
	OrderID    string  `json:"order_id"`
	Paid       bool    `json:"paid"`
	Amount     float64 `json:"amount"`
	Shipped    bool    `json:"shipped"`
	ShipmentID string  `json:"shipment_id,omitempty"`
	Status     string  `json:"status"`
}

const name = "fulfillment"

func init() {
	pdk.Module("fulfillment", "1.0.0")
	pdk.Event[PaymentRecorded]("PaymentRecorded", "payment")
	pdk.Event[OrderShipped]("OrderShipped", "shipping")

	h := pdk.ProcessManager(name).SequentialByCorrelation().
		Correlate("PaymentRecorded", "order_id").
		Correlate("OrderShipped", "order_id")
	pdk.On(h, "PaymentRecorded", func(ctx *pdk.Context, ev PaymentRecorded) error {
		return advance(ctx, ev.OrderID, func(f *Fulfillment) { f.Paid, f.Amount = true, f.Amount+ev.Amount })
	})
	pdk.On(h, "OrderShipped", func(ctx *pdk.Context, ev OrderShipped) error {
		return advance(ctx, ev.OrderID, func(f *Fulfillment) { f.Shipped, f.ShipmentID = true, ev.ShipmentID })
	})
}

func advance(ctx *pdk.Context, orderID string, change func(*Fulfillment)) error {
	f := Fulfillment{OrderID: orderID}
	v, err := ctx.Load(pdk.Process, name, orderID, &f)
	if err != nil {
		return err
	}
	change(&f)
	switch {
	case f.Paid && f.Shipped:
		f.Status = "fulfilled"
	case f.Paid:
		f.Status = "paid"
	default:
		f.Status = "shipped"
	}
	if err := ctx.Save(pdk.Process, name, orderID, v, f); err != nil {
		return err
	}
	// The projection mirrors the state; it is written blind at its own
	// version, which only this process manager advances.
	var doc Fulfillment
	pv, err := ctx.Load(pdk.Projection, name, orderID, &doc)
	if err != nil {
		return err
	}
	return ctx.Save(pdk.Projection, name, orderID, pv, f)
}

func main() {}
