package main

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// The quickstart's read right after its command, with the command's global
// position as min_position, answers the document: never 404, never a
// document without the command's event. Without min_position a read is
// eventually consistent (the other quickstart test waits for it).
func TestEmbeddedReadYourWrites(t *testing.T) {
	h := embedded(t, wasmbuild.Examples(t))
	for i := range 100 {
		r := post(t, h, "PlaceOrder", fmt.Sprintf(`{"order_id":"o-%d","client_id":"c-%d","total":%d}`, i, i%7, i))
		require.Equal(t, 200, r.code, r.raw)
		gp := int64(r.body["events"].([]any)[0].(map[string]any)["global_position"].(float64))
		doc := get(t, h, fmt.Sprintf("/v1/projections/client_orders/c-%d?min_position=%d", i%7, gp))
		require.Equal(t, 200, doc.code, "read %d: %s\nhost log:\n%s", i, doc.raw, h.logs.Tail(10))
		require.Contains(t, doc.body["order_ids"], fmt.Sprintf("o-%d", i), "read %d: %s", i, doc.raw)
	}
	// The process manager reads payment and shipping: its document is
	// fulfilled as of the second command's position.
	require.Equal(t, 200, post(t, h, "RecordPayment", `{"payment_id":"p-1","order_id":"o-1","amount":1}`).code)
	r := post(t, h, "ShipOrder", `{"shipment_id":"s-1","order_id":"o-1"}`)
	require.Equal(t, 200, r.code, r.raw)
	gp := int64(r.body["events"].([]any)[0].(map[string]any)["global_position"].(float64))
	doc := get(t, h, fmt.Sprintf("/v1/projections/fulfillment/o-1?min_position=%d", gp))
	require.Equal(t, 200, doc.code, doc.raw)
	require.Equal(t, "fulfilled", doc.body["status"], doc.raw)

	for _, bad := range []string{"x", "-1", "1.5", ""} {
		r := get(t, h, "/v1/projections/client_orders/c-1?min_position="+bad)
		require.Equal(t, 400, r.code, "min_position=%q: %s", bad, r.raw)
		require.Contains(t, r.body["error"], "min_position must be a global position")
	}
	require.Equal(t, 404, get(t, h, "/v1/projections/nope/x?min_position=1").code)
}
