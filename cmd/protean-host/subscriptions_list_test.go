package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/position"
)

// subscriptions list shows the event-store subscriptions of Protean's
// categories, which hold "::" ("test::order"), and of MessageDB-style
// categories with a ":" ("account:command") that have events, and leaves
// out the Redis partitions' rows ("test::order:c-1"). It hid every
// category with a colon, so on a Protean domain it listed nothing.
func TestSubscriptionsListShowsColonCategories(t *testing.T) {
	cfg, pool := migratedDB(t)
	ctx := context.Background()
	data, _ := json.Marshal(map[string]any{"a": 1})
	_, err := eventstore.NewPostgres(pool).Append(ctx, []eventstore.NewEvent{
		{Stream: "test::order-1", Type: "Placed", Data: data, ExpectedVersion: eventstore.AnyVersion},
		{Stream: "account:command-7", Type: "Open", Data: data, ExpectedVersion: eventstore.AnyVersion},
	})
	require.NoError(t, err)
	ps := position.NewPostgres(pool, nil)
	require.NoError(t, ps.Set(ctx, "orders", "test::order", "test::order", 1))
	require.NoError(t, ps.Set(ctx, "accounts", "account:command", "account:command", 2))
	require.NoError(t, ps.Set(ctx, "orders", "test::order:c-1", "test::order:c-1", 1)) // a Redis partition

	code, out, errs := cli(t, "subscriptions", "list", "--config", cfg)
	require.Equal(t, 0, code, errs)
	require.Regexp(t, `(?m)^orders\s+test::order\s+1\s+1\s+0\s`, out)
	require.Regexp(t, `(?m)^accounts\s+account:command\s+2\s+2\s+0\s`, out)
	require.NotContains(t, out, "c-1", "a partition's row belongs to partitions list")
}

// Bad input to the operator commands is a clear error naming what is
// wrong, and changes nothing: an unknown group (list and failed used to
// print an empty table, as if the group were caught up with no failures),
// an unknown record, a position that is not a positive integer, a missing
// argument.
func TestSubscriptionsCommandsRefuseBadInput(t *testing.T) {
	cfg, pool := migratedDB(t)
	ctx := context.Background()
	require.NoError(t, position.NewPostgres(pool, nil).Set(ctx, "orders", "test::order", "test::order", 1))

	for _, c := range []struct {
		args []string
		want string
		code int // 1: it failed; 2: a usage error
	}{
		{[]string{"list", "--group", "nope"}, `group "nope"`, 1},
		{[]string{"failed", "--group", "nope"}, `group "nope"`, 1},
		{[]string{"retry", "nope", "test::order", "5"}, "no such failure record", 1},
		{[]string{"skip", "orders", "test::order", "x"}, `POSITION "x" must be a positive integer`, 2},
		{[]string{"skip", "orders", "test::order", "0"}, `POSITION "0" must be a positive integer`, 2},
		{[]string{"retry", "orders", "test::order"}, "takes 3 arguments, got 2", 2},
		{[]string{"frobnicate"}, `unknown subcommand "frobnicate"`, 2},
	} {
		code, out, errs := cli(t, append(append([]string{"subscriptions"}, c.args...), "--config", cfg)...)
		require.Equal(t, c.code, code, "%v: %s", c.args, out)
		require.Contains(t, errs, c.want, "%v", c.args)
	}
	code, out, errs := cli(t, "subscriptions", "failed", "--group", "orders", "--config", cfg)
	require.Equal(t, 0, code, errs)
	require.NotContains(t, out, "orders", "a known group with no failure records: an empty table")
	code, out, errs = cli(t, "subscriptions", "list", "--group", "orders", "--config", cfg)
	require.Equal(t, 0, code, errs)
	require.Regexp(t, `(?m)^orders\s+test::order\s+1\s`, out)
}

// migratedDB is a database the CLI migrated, with a config naming it (no
// plugins) and a pool on it.
func migratedDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	d := pgInline{dbURL: testserver.Postgres(t), dir: t.TempDir()}
	cfg := d.migrate(t)
	return cfg, d.pool
}

// subscriptions list's LEASE column: "none" with no holder, the time left
// while the lease runs, "lapsed" once it has run out.
func TestSubscriptionsLeaseState(t *testing.T) {
	require.Equal(t, "none", leaseState(time.Now().Add(time.Hour), false))
	require.Regexp(t, `^expires in \S+$`, leaseState(time.Now().Add(time.Hour), true))
	require.Equal(t, "lapsed", leaseState(time.Now().Add(-time.Second), true))
}
