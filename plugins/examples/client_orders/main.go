// Command client_orders is the example projector: per client, the number of
// orders placed, their total, and their ids in the order the projector
// processed them. It is partitioned by client_id, so a client's orders are
// projected one at a time and in publish order.
package main

import "github.com/proteanhq/protean-host/pdk"

// version is the module's version; the reload benchmark links two builds
// that differ in it (-ldflags "-X main.version=...").
var version = "1.0.0"

type OrderPlaced struct {
	OrderID  string  `json:"order_id"`
	ClientID string  `json:"client_id"`
	Total    float64 `json:"total"`
}

// ClientOrders is the projection document, id = client_id.
type ClientOrders struct {
	ClientID string   `json:"client_id"`
	Orders   int      `json:"orders"`
	Total    float64  `json:"total"`
	OrderIDs []string `json:"order_ids"`
}

const name = "client_orders"

func init() {
	pdk.Module("client_orders", version)
	pdk.Event[OrderPlaced]("OrderPlaced", "order")

	h := pdk.Projector(name, "order").SequentialBy("client_id").DocumentsByKey()
	pdk.On(h, "OrderPlaced", onPlaced)
}

func onPlaced(ctx *pdk.Context, ev OrderPlaced) error {
	doc := ClientOrders{ClientID: ev.ClientID, OrderIDs: []string{}}
	v, err := ctx.Load(pdk.Projection, name, ev.ClientID, &doc)
	if err != nil {
		return err
	}
	doc.Orders++
	doc.Total += ev.Total
	doc.OrderIDs = append(doc.OrderIDs, ev.OrderID)
	return ctx.Save(pdk.Projection, name, ev.ClientID, v, doc)
}

func main() {}
