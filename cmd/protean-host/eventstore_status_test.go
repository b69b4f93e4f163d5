package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/htmltest"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// On PostgreSQL with the inline broker (event-store subscriptions), a read
// with min_position answers the command's event, and the status page
// shows the subscriptions with their lag.
func TestEventStoreReadYourWritesAndStatusPage(t *testing.T) {
	d := newPGInline(t)
	h, err := startHostWith(t, "domain.toml", d.dir, func(c *config.Config) {
		c.Databases["default"] = config.Database{Provider: "postgresql", DatabaseURI: d.dbURL}
		c.EventStore = config.EventStore{Provider: "message_db", DatabaseURI: d.dbURL}
		c.Server.EventStoreSubscription.PollIntervalMS = 20
	})
	require.NoError(t, err)
	for i := range 20 {
		client := fmt.Sprintf("c-%d", i%3)
		r := post(t, h, "PlaceOrder", fmt.Sprintf(`{"order_id":"o-%d","client_id":%q,"total":1}`, i, client))
		require.Equal(t, 200, r.code, r.raw)
		gp := int64(r.body["events"].([]any)[0].(map[string]any)["global_position"].(float64))
		doc := get(t, h, fmt.Sprintf("/v1/projections/client_orders/%s?min_position=%d", client, gp))
		require.Equal(t, 200, doc.code, "read %d: %s\nlog:\n%s", i, doc.raw, h.logs.Tail(10))
		require.Contains(t, doc.body["order_ids"], fmt.Sprintf("o-%d", i), "read %d: %s", i, doc.raw)
	}
	// The read above saw its event as soon as its key slot committed; the
	// unit's position (the low-water mark the page's lag is measured
	// from) follows when every slot has finished the batch.
	var doc *htmltest.Node
	testwait.For(t, "the status page shows the subscription caught up", func() (bool, string) {
		page := get(t, h, "/")
		if page.code != 200 {
			return false, page.raw
		}
		var err error
		if doc, err = htmltest.Parse(strings.NewReader(page.raw)); err != nil {
			return false, err.Error()
		}
		cons := doc.All("consumer", "data-group", "client_orders")
		if len(cons) != 1 {
			return false, page.raw
		}
		got := cons[0].Cells()
		return slices.Equal(got, []string{"client_orders", "order", "event_store", "0", "0"}), fmt.Sprint(got)
	})
	require.Empty(t, doc.All("problem"), "every part of the status was read")
}
