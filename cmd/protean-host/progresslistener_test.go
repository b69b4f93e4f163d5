package main

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/partition"
)

// heard is a host's protean_partition_advances_heard_total.
func heard(t *testing.T, h *testHost) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^protean_partition_advances_heard_total (\d+)`).FindStringSubmatch(get(t, h, "/metrics").raw)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// A host that does not run a key's unit hears of the unit's commits on the
// other host (the positions store's notifications, progressListener), and
// a read of one's own write on it, after a command on it, answers the
// command's event.
func TestAnotherHostHearsAPartitionCommit(t *testing.T) {
	hosts := newRedisDeployment(t).startHosts(t, 2)
	unit := partition.PartitionUnit("order", "c-1")
	owner := -1
	for i := 0; owner < 0; i++ {
		r := post(t, hosts[0], "PlaceOrder", fmt.Sprintf(`{"order_id":"o-%d","client_id":"c-1","total":1}`, i))
		require.Equal(t, 200, r.code, r.raw)
		projected(t, hosts[0], "the order projected", fmt.Sprintf("/v1/projections/client_orders/c-1?min_position=%d", globalPosition(t, r)))
		for j, h := range hosts {
			if slices.ContainsFunc(h.partitions.Owned(), func(l redispartition.Lease) bool { return l.Group == "client_orders" && l.Unit == unit }) {
				owner = j
			}
		}
	}
	other := hosts[1-owner]
	before := heard(t, other)
	require.GreaterOrEqual(t, before, 0, "no protean_partition_advances_heard_total on the host that does not run the unit")
	for i := range 5 {
		id := fmt.Sprintf("o-other-%d", i)
		r := post(t, other, "PlaceOrder", fmt.Sprintf(`{"order_id":%q,"client_id":"c-1","total":1}`, id))
		require.Equal(t, 200, r.code, r.raw)
		doc := get(t, other, fmt.Sprintf("/v1/projections/client_orders/c-1?min_position=%d", globalPosition(t, r)))
		require.Equal(t, 200, doc.code, doc.raw)
		require.Contains(t, stringsOf(doc.body["order_ids"]), id)
	}
	eventually(t, other, "the host that does not run the unit hears of its commits", func() (bool, string) {
		n := heard(t, other)
		return n >= before+5, fmt.Sprintf("heard %d advances, %d before the orders", n, before)
	})
}

// globalPosition is the global position of a command answer's first event.
func globalPosition(t *testing.T, r reply) int64 {
	t.Helper()
	evs, _ := r.body["events"].([]any)
	require.NotEmpty(t, evs, r.raw)
	gp, _ := evs[0].(map[string]any)["global_position"].(float64)
	return int64(gp)
}
