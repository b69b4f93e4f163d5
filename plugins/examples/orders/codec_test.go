//go:build !reflectjson

package main

import (
	"testing"

	"github.com/proteanhq/protean-host/pdk/pdktest"
)

func TestCodec(t *testing.T) {
	id, client := "o-\"1\"\\\n\t<&>", "c-é😀\u2028\x01"
	pdktest.Codec(t, PlaceOrder{}, PlaceOrder{OrderID: id, ClientID: client, Total: -1.5e300})
	pdktest.Codec(t, CancelOrder{}, CancelOrder{OrderID: id})
	pdktest.Codec(t, Order{}, Order{OrderID: id, ClientID: client, Total: 0.1 + 0.2, Status: "cancelled"})
	pdktest.Codec(t, OrderPlaced{}, OrderPlaced{OrderID: id, ClientID: client, Total: 42})
	pdktest.Codec(t, OrderCancelled{}, OrderCancelled{OrderID: id, ClientID: client})
}
