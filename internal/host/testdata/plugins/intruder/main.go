// Command intruder is a hostile test module of tenant "intruder": it
// declares the shop tenant's OrderPlaced event as a read (its projector
// subscribes to it, which needs the shop's grant_read), and its Intrude
// command then tries, by Op, every way into the shop's data: load and read
// what it was granted (allowed), and write aggregates, append events,
// write projections, dispatch commands and read categories it was not
// granted (each refused by the host, whatever the manifest says).
package main

import "github.com/proteanhq/protean-host/pdk"

type Intrude struct {
	Op string `json:"op"`
	ID string `json:"id"`
}

type OrderPlaced struct {
	OrderID  string  `json:"order_id"`
	ClientID string  `json:"client_id"`
	Total    float64 `json:"total"`
}

type Intruded struct {
	ID string `json:"id"`
	N  int    `json:"n"`
}

type seen struct {
	Orders int `json:"orders"`
}

func init() {
	pdk.Module("intruder", "1.0.0")
	pdk.Event[OrderPlaced]("OrderPlaced", "order")
	pdk.Command[Intrude]("Intrude", "intrusion")
	pdk.Event[Intruded]("Intruded", "intrusion")
	pdk.On(pdk.Projector("intruder_orders", "order"), "OrderPlaced", func(ctx *pdk.Context, ev OrderPlaced) error {
		var d seen
		v, err := ctx.Load(pdk.Projection, "intruder_orders", ev.ClientID, &d)
		if err != nil {
			return err
		}
		d.Orders++
		return ctx.Save(pdk.Projection, "intruder_orders", ev.ClientID, v, d)
	})
	pdk.On(pdk.CommandHandler("intrude", "intrusion"), "Intrude", func(ctx *pdk.Context, m Intrude) error {
		var v map[string]any
		switch m.Op {
		case "load": // granted read
			n, err := ctx.Load(pdk.Aggregate, "order", m.ID, &v)
			if err != nil {
				return err
			}
			return ctx.Emit("intrusion-"+m.ID, "Intruded", Intruded{ID: m.ID, N: int(n)})
		case "read": // granted read
			evs, err := ctx.ReadStream("order-"+m.ID, 0, 10)
			if err != nil {
				return err
			}
			return ctx.Emit("intrusion-"+m.ID, "Intruded", Intruded{ID: m.ID, N: len(evs)})
		case "load_payment": // not granted
			_, err := ctx.Load(pdk.Aggregate, "payment", m.ID, &v)
			return err
		case "read_payment": // not granted
			_, err := ctx.ReadStream("payment-"+m.ID, 0, 10)
			return err
		case "write": // overwrite the shop's aggregate
			return ctx.Save(pdk.Aggregate, "order", m.ID, 1, map[string]any{"order_id": m.ID, "total": 1e9})
		case "emit": // a forged OrderPlaced
			return ctx.Emit("order-"+m.ID, "OrderPlaced", OrderPlaced{OrderID: m.ID, ClientID: "victim", Total: 1e9})
		case "emit_undeclared":
			return ctx.Emit("order-"+m.ID, "OrderCancelled", map[string]string{"order_id": m.ID})
		case "projection":
			return ctx.Save(pdk.Projection, "client_orders", "victim", 0, map[string]any{"orders": 99})
		case "dispatch": // cancel someone's order
			return ctx.Dispatch("CancelOrder", map[string]string{"order_id": m.ID})
		}
		return nil
	})
}

func main() {}
