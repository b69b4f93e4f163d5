// Command payments is the example module of the payment aggregate: the
// command handler for RecordPayment, emitting PaymentRecorded on category
// "payment" (stream payment-{payment_id}).
package main

import (
	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/pdk"
)

type RecordPayment struct {
	PaymentID string  `json:"payment_id"`
	OrderID   string  `json:"order_id"`
	Amount    float64 `json:"amount"`
}

// PaymentRecorded carries order_id, the fulfillment process manager's
// partition key on category "payment".
type PaymentRecorded struct {
	PaymentID string  `json:"payment_id"`
	OrderID   string  `json:"order_id"`
	Amount    float64 `json:"amount"`
}

func init() {
	pdk.Module("payments", "1.0.0")
	pdk.Command[RecordPayment]("RecordPayment", "payment")
	pdk.Event[PaymentRecorded]("PaymentRecorded", "payment")

	h := pdk.CommandHandler("payments", "payment")
	pdk.On(h, "RecordPayment", recordPayment)
}

func recordPayment(ctx *pdk.Context, cmd RecordPayment) error {
	if cmd.PaymentID == "" || cmd.OrderID == "" {
		return pdk.Rejected("payment_id and order_id are required")
	}
	if cmd.Amount <= 0 {
		return pdk.Rejected("amount %v must be positive", cmd.Amount)
	}
	var p RecordPayment
	v, err := ctx.Load(pdk.Aggregate, "payment", cmd.PaymentID, &p)
	if err != nil {
		return err
	}
	if v != 0 {
		return pdk.Rejected("payment %s already recorded", cmd.PaymentID)
	}
	if err := ctx.Save(pdk.Aggregate, "payment", cmd.PaymentID, 0, cmd); err != nil {
		return err
	}
	return ctx.EmitExpecting("payment-"+cmd.PaymentID, "PaymentRecorded", PaymentRecorded(cmd), abi.NoStream)
}

func main() {}
