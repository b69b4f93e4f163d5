package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/htmltest"
)

// On Redis partitions shared by two instances, a read with min_position
// on either instance answers the document with the command's event, also
// when the other instance's partition worker handled it (the positions
// table tells); each status page lists the partitions it sees owned and
// the partition consumers.
func TestRedisReadYourWritesAndStatusPage(t *testing.T) {
	hosts := newRedisDeployment(t).startHosts(t, 2)
	for i := range 20 {
		client := fmt.Sprintf("c-%d", i%3)
		r := post(t, hosts[i%2], "PlaceOrder", fmt.Sprintf(`{"order_id":"o-%d","client_id":%q,"total":1}`, i, client))
		require.Equal(t, 200, r.code, r.raw)
		gp := int64(r.body["events"].([]any)[0].(map[string]any)["global_position"].(float64))
		doc := get(t, hosts[(i+1)%2], fmt.Sprintf("/v1/projections/client_orders/%s?min_position=%d", client, gp))
		require.Equal(t, 200, doc.code, "read %d: %s\nlog:\n%s", i, doc.raw, hosts[(i+1)%2].logs.Tail(10))
		require.Contains(t, doc.body["order_ids"], fmt.Sprintf("o-%d", i), "read %d: %s", i, doc.raw)
	}
	owned := 0
	for _, h := range hosts {
		page := get(t, h, "/")
		require.Equal(t, 200, page.code)
		doc, err := htmltest.Parse(strings.NewReader(page.raw))
		require.NoError(t, err)
		owned += len(doc.All("partition", "data-state", "owned"))
		cons := doc.All("consumer", "data-group", "client_orders")
		require.Len(t, cons, 1, page.raw)
		require.Equal(t, "partitions", cons[0].Cells()[2])
		require.Equal(t, "order", cons[0].Cells()[1], "the group's categories as a list, not a Go slice")
		require.Empty(t, doc.All("partition", "data-state", "halted"))
	}
	require.GreaterOrEqual(t, owned, 2*3, "both pages list the three client_orders partitions as owned")
}
