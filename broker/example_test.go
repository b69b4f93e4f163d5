package broker_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
)

// A relay publishes; a consumer group receives in publish order, nacks a
// message that fails, and receives it again before the next one.
func Example() {
	opts := broker.DefaultOptions()
	opts.Delay = 0 // redeliver at once, for the example
	b, err := broker.NewInline(opts)
	if err != nil {
		panic(err)
	}
	defer b.Close()
	ctx := context.Background()

	_ = b.Publish(ctx,
		delivery.Message{ID: "e1", Stream: "order", Type: "OrderPlaced", Data: json.RawMessage(`{"order_id":"o-1"}`)},
		delivery.Message{ID: "e2", Stream: "order", Type: "OrderCancelled", Data: json.RawMessage(`{"order_id":"o-1"}`)},
	)

	d, _ := b.Wait(ctx, "order", "client_orders")
	fmt.Println(d.ID, d.Type, "attempt", d.Attempt)
	_ = b.Nack(ctx, "order", "client_orders", d.ID) // the handler failed

	for {
		d, err := b.Next(ctx, "order", "client_orders")
		if err != nil {
			fmt.Println(err)
			break
		}
		fmt.Println(d.ID, d.Type, "attempt", d.Attempt)
		_ = b.Ack(ctx, "order", "client_orders", d.ID)
	}
	// Output:
	// e1 OrderPlaced attempt 1
	// e1 OrderPlaced attempt 2
	// e2 OrderCancelled attempt 1
	// no message ready
}
