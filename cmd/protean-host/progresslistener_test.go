package main

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
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
	// On the unit's host, a read of one's own write is answered from the
	// document cache: the notification of the unit's commit, which came
	// before the worker kept the document, no longer wakes it early.
	owning := hosts[owner]
	fromDB, fromCache := projectionReads(t, owning, "database"), projectionReads(t, owning, "cache")
	for i := range 5 {
		r := post(t, owning, "PlaceOrder", fmt.Sprintf(`{"order_id":"o-owner-%d","client_id":"c-1","total":1}`, i))
		require.Equal(t, 200, r.code, r.raw)
		doc := get(t, owning, fmt.Sprintf("/v1/projections/client_orders/c-1?min_position=%d", globalPosition(t, r)))
		require.Equal(t, 200, doc.code, doc.raw)
	}
	require.Equal(t, fromDB, projectionReads(t, owning, "database"), "reads answered from the database on the unit's host")
	require.Equal(t, fromCache+5, projectionReads(t, owning, "cache"), "reads answered from the cache on the unit's host")
}

// projectionReads is a host's protean_projection_reads_total{from}.
func projectionReads(t *testing.T, h *testHost, from string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^protean_projection_reads_total\{from="` + from + `"\} (\d+)`).FindStringSubmatch(get(t, h, "/metrics").raw)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// globalPosition is the global position of a command answer's first event.
func globalPosition(t *testing.T, r reply) int64 {
	t.Helper()
	evs, _ := r.body["events"].([]any)
	require.NotEmpty(t, evs, r.raw)
	gp, _ := evs[0].(map[string]any)["global_position"].(float64)
	return int64(gp)
}

// localUnits is a LocalUnits of the units in it.
type localUnits map[string]bool

func (l localUnits) Committed(group, unit string) (int64, bool) { return 0, l[group+"/"+unit] }

// An advance of a unit this host runs is not handed to the waits (its
// worker marks its events after the engine kept the documents the run
// wrote); another host's is, and a lane's is not.
func TestProgressListenerLeavesItsOwnUnitsToTheirWorkers(t *testing.T) {
	t.Parallel()
	var got []string
	l := &progressListener{local: localUnits{"client_orders/" + partition.PartitionUnit("order", "c-1"): true},
		backfill: "backfill", heard: prometheus.NewCounter(prometheus.CounterOpts{Name: "heard"}),
		handled: func(group, category, key string, gp int64) {
			got = append(got, fmt.Sprintf("%s %s %s %d", group, category, key, gp))
		}}
	l.advanced([]position.Advanced{
		{Group: "client_orders", Unit: partition.PartitionUnit("order", "c-1"), Positions: map[string]int64{partition.StreamName("order", "c-1"): 7}},
		{Group: "client_orders", Unit: partition.PartitionUnit("order", "c-2"), Positions: map[string]int64{partition.StreamName("order", "c-2"): 8}},
		{Group: "fulfillment", Unit: partition.PartitionUnit("order", "c-1"), Positions: map[string]int64{partition.StreamName("order", "c-1"): 9}},
	})
	require.Equal(t, []string{"client_orders order c-2 8", "fulfillment order c-1 9"}, got)
}
