package main

import "github.com/proteanhq/protean-host/pdk"

// Trespass is a command whose handler reaches outside the module's scope in
// the way its Op says, so a test can see the host's scope error come out of
// a dispatch: "write" saves another module's projection (an effect the
// host refuses), "load" loads an aggregate of a category the module does
// not declare, "read" reads a stream of one (host functions the host
// refuses). The handler returns the load's or read's error as it gets it.
func init() {
	pdk.Command[Op]("Trespass", "ops")
	pdk.On(pdk.CommandHandler("trespass", "ops"), "Trespass", func(ctx *pdk.Context, m Op) error {
		switch m.Op {
		case "write":
			return ctx.Save(pdk.Projection, "client_orders", m.ID, 0, map[string]int{"orders": 99})
		case "load":
			var d doc
			_, err := ctx.Load(pdk.Aggregate, "order", m.ID, &d)
			return err
		case "read":
			_, err := ctx.ReadStream("order-"+m.ID, 0, 10)
			return err
		}
		return nil
	})
}
