package main

import (
	"testing"

	"github.com/proteanhq/protean-host/pdk/pdktest"
)

func TestCodec(t *testing.T) {
	pdktest.Codec(t, OrderPlaced{}, OrderPlaced{OrderID: "o-\"1\"\\\n", ClientID: "c-é😀\u2028", Total: -1.5e300})
	pdktest.Codec(t, ClientOrders{}, ClientOrders{ClientID: "c-1", Orders: 3, Total: 0.1 + 0.2, OrderIDs: []string{"a", "<b>&"}},
		ClientOrders{OrderIDs: []string{}})
}
