// Command declared is a test module built through the pdk whose
// declarations are chosen at link time with -ldflags "-X main.variant=NAME",
// so one source yields every registration case the host tests pin.
package main

import "github.com/proteanhq/protean-host/pdk"

var variant = "projector"

// version is the module's version (-X main.version=...), so a test can
// build two versions of one module.
var version = "0.0.1"

type placedWithClient struct {
	OrderID  string `json:"order_id"`
	ClientID string `json:"client_id"`
}

type placedWithoutClient struct {
	OrderID string `json:"order_id"`
}

type payment struct {
	PaymentID string `json:"payment_id"`
	OrderID   string `json:"order_id"`
}

type paymentNoOrder struct {
	PaymentID string `json:"payment_id"`
}

type shipped struct {
	ShipmentID string `json:"shipment_id"`
	OrderID    string `json:"order_id"`
}

type placeOrderNoClient struct {
	OrderID string `json:"order_id"`
}

func nop[T any](*pdk.Context, T) error { return nil }

func init() {
	pdk.Module(variant, version)
	switch variant {
	case "projector": // valid: order partitioned by client_id
		pdk.Event[placedWithClient]("OrderPlaced", "order")
		pdk.On(pdk.Projector("by_client", "order").SequentialBy("client_id"), "OrderPlaced", nop[placedWithClient])
	case "projector_by_order": // valid alone; conflicts with "projector"
		pdk.Event[placedWithClient]("OrderPlaced", "order")
		pdk.On(pdk.Projector("by_order", "order").SequentialBy("order_id"), "OrderPlaced", nop[placedWithClient])
	case "event_handler_missing_field":
		pdk.Event[placedWithoutClient]("OrderPlaced", "order")
		pdk.On(pdk.EventHandler("notify", "order").SequentialBy("client_id"), "OrderPlaced", nop[placedWithoutClient])
	case "command_handler_missing_field":
		pdk.Command[placeOrderNoClient]("PlaceOrder", "order")
		pdk.On(pdk.CommandHandler("orders", "order").SequentialBy("client_id"), "PlaceOrder", nop[placeOrderNoClient])
	case "pm_missing_correlate_field":
		pdk.Event[paymentNoOrder]("PaymentRecorded", "payment")
		pdk.Event[shipped]("OrderShipped", "shipping")
		h := pdk.ProcessManager("fulfillment").SequentialByCorrelation().
			Correlate("PaymentRecorded", "order_id").Correlate("OrderShipped", "order_id")
		pdk.On(h, "PaymentRecorded", nop[paymentNoOrder])
		pdk.On(h, "OrderShipped", nop[shipped])
	case "pm": // valid: payment and shipping partitioned by order_id
		pdk.Event[payment]("PaymentRecorded", "payment")
		pdk.Event[shipped]("OrderShipped", "shipping")
		h := pdk.ProcessManager("fulfillment").SequentialByCorrelation().
			Correlate("PaymentRecorded", "order_id").Correlate("OrderShipped", "order_id")
		pdk.On(h, "PaymentRecorded", nop[payment])
		pdk.On(h, "OrderShipped", nop[shipped])
	case "payment_by_id": // conflicts with "pm" on category payment
		pdk.Event[payment]("PaymentRecorded", "payment")
		pdk.On(pdk.EventHandler("ledger", "payment").SequentialBy("payment_id"), "PaymentRecorded", nop[payment])
	case "order_writer": // writes category order: a tenant that has it owns it
		pdk.Command[placeOrderNoClient]("PlaceOrder", "order")
		pdk.On(pdk.CommandHandler("place", "order").SequentialBy("order_id"), "PlaceOrder", nop[placeOrderNoClient])
	case "order_hijacker": // writes category order too: a second claimant
		pdk.Command[placeOrderNoClient]("HijackOrder", "order")
		pdk.On(pdk.CommandHandler("hijack", "order").SequentialBy("order_id"), "HijackOrder", nop[placeOrderNoClient])
	case "unpartitioned_without_key": // declares OrderPlaced without client_id
		pdk.Event[placedWithoutClient]("OrderPlaced", "order")
		pdk.On(pdk.EventHandler("audit", "order"), "OrderPlaced", nop[placedWithoutClient])
	default:
		panic("unknown variant " + variant)
	}
}

func main() {}
