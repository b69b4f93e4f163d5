package main

import (
	"testing"

	"github.com/proteanhq/protean-host/pdk"
	"github.com/proteanhq/protean-host/pdk/pdktest"
)

func TestPlaceOrderTwice(t *testing.T) {
	h := pdktest.New(t)
	res := h.Command("PlaceOrder", PlaceOrder{OrderID: "o-1", ClientID: "c-1", Total: 42})
	if res.Err != nil || len(res.Events) != 1 || res.Events[0].Type != "OrderPlaced" {
		t.Fatalf("first PlaceOrder: %+v", res)
	}
	var o Order
	if v := h.Load(pdk.Aggregate, "order", "o-1", &o); v != 1 || o != (Order{OrderID: "o-1", ClientID: "c-1", Total: 42, Status: "placed"}) {
		t.Fatalf("aggregate at version %d: %+v", v, o)
	}
	if res := h.Command("PlaceOrder", PlaceOrder{OrderID: "o-1", ClientID: "c-1", Total: 42}); res.Err == nil {
		t.Fatal("PlaceOrder of an order that exists: no error")
	}
	if res := h.Command("CancelOrder", CancelOrder{OrderID: "o-1"}); res.Err != nil {
		t.Fatalf("CancelOrder: %v", res.Err)
	}
	if h.Load(pdk.Aggregate, "order", "o-1", &o); o.Status != "cancelled" {
		t.Fatalf("cancelled aggregate: %+v", o)
	}
}
