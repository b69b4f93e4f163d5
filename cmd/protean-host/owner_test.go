package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// Two hosts in one process share a hostname and a pid, as two containers
// with pid 1 on one hostname do. Each start is still its own owner: the
// second cannot take or renew the first's subscription leases (with one
// name it could, and both would run every subscription, fenced against
// each other).
func TestHostsWithOneHostnameAndPidAreDistinctOwners(t *testing.T) {
	d := newPGInline(t)
	onPG := func(c *config.Config) {
		c.Databases["default"] = config.Database{Provider: "postgresql", DatabaseURI: d.dbURL}
		c.EventStore = config.EventStore{Provider: "message_db", DatabaseURI: d.dbURL}
		c.Server.EventStoreSubscription.PollIntervalMS = 20
	}
	a, err := startHostWith(t, "domain.toml", d.dir, onPG)
	require.NoError(t, err)
	ctx := testwait.Context(t)
	var held [][2]string
	testwait.For(t, "the first host holds the subscription leases", func() (bool, string) {
		rows, err := d.pool.Query(ctx, `SELECT consumer_group, unit, owner FROM subscription_leases ORDER BY 1, 2`)
		if err != nil {
			return false, err.Error()
		}
		defer rows.Close()
		held = held[:0]
		var all []string
		mine := true
		for rows.Next() {
			var g, u, o string
			if err := rows.Scan(&g, &u, &o); err != nil {
				return false, err.Error()
			}
			held = append(held, [2]string{g, u})
			all = append(all, g+"/"+u+"="+o)
			mine = mine && o == a.owner
		}
		return rows.Err() == nil && len(held) > 0 && mine, fmt.Sprint(all, rows.Err())
	})
	b, err := startHostWith(t, "domain.toml", d.dir, onPG)
	require.NoError(t, err)
	require.NotEqual(t, a.owner, b.owner, "one hostname, one pid, two starts")
	leases := subscription.NewPostgresLeases(d.pool)
	for _, l := range held {
		ok, err := leases.Acquire(ctx, l[0], l[1], b.owner, time.Minute)
		require.NoError(t, err)
		require.False(t, ok, "%s/%s: the second host takes the first's live lease", l[0], l[1])
		ok, err = leases.Renew(ctx, l[0], l[1], b.owner, time.Minute)
		require.NoError(t, err)
		require.False(t, ok, "%s/%s: the second host renews the first's lease", l[0], l[1])
		o, _, ok, err := leases.Holder(ctx, l[0], l[1])
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, a.owner, o, "%s/%s", l[0], l[1])
	}
}
