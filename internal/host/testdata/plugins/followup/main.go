// Command followup is a test process manager that follows every placed
// order up with a command of its own: it correlates OrderPlaced by
// client_id (the key the orders category is partitioned by) and
// dispatches Note, which its own command handler records as
// a Noted event. A trace test follows a command through it.
package main

import "github.com/proteanhq/protean-host/pdk"

type OrderPlaced struct {
	OrderID  string  `json:"order_id"`
	ClientID string  `json:"client_id"`
	Total    float64 `json:"total"`
}

type Note struct {
	OrderID string `json:"order_id"`
}

type Noted struct {
	OrderID string `json:"order_id"`
}

func init() {
	pdk.Module("followup", "1.0.0")
	pdk.Event[OrderPlaced]("OrderPlaced", "order")
	pdk.Command[Note]("Note", "note")
	pdk.Event[Noted]("Noted", "note")
	pm := pdk.ProcessManager("followup").SequentialByCorrelation().Correlate("OrderPlaced", "client_id")
	pdk.On(pm, "OrderPlaced", func(ctx *pdk.Context, ev OrderPlaced) error {
		return ctx.Dispatch("Note", Note{OrderID: ev.OrderID})
	})
	pdk.On(pdk.CommandHandler("notes", "note"), "Note", func(ctx *pdk.Context, c Note) error {
		return ctx.Emit("note-"+c.OrderID, "Noted", Noted{OrderID: c.OrderID})
	})
}

func main() {}
