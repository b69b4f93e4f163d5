package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/auth"
	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/htmltest"
	"github.com/proteanhq/protean-host/internal/ops"
	"github.com/proteanhq/protean-host/internal/redispartition"
)

// TestOperationsAreTheTenants: on PostgreSQL and Redis, a poison entry
// halts shop's client_orders partition order:c-poison. Shop's operator
// sees it, inspects it and skips it over HTTP; lab's operator sees none
// of it (not in its lists, 403 on its inspect and its actions, the same
// 403 as any refusal), and the audit log shows the skip to shop and the
// admin only.
func TestOperationsAreTheTenants(t *testing.T) {
	h, f := poisonedHost(t)

	partitions := func(principal string) []ops.Partition {
		t.Helper()
		code, body := f.request(t, h, principal, "GET", "/v1/ops/partitions", "")
		require.Equal(t, 200, code, body)
		var ps []ops.Partition
		require.NoError(t, json.Unmarshal([]byte(body), &ps), body)
		return ps
	}
	halted := func(ps []ops.Partition) *ops.Partition {
		for _, p := range ps {
			if p.Key == "c-poison" && p.State == "halted" {
				return &p
			}
		}
		return nil
	}
	eventually(t, h, "order:c-poison halted", func() (bool, string) {
		ps := partitions("admin")
		return halted(ps) != nil, fmt.Sprint(ps)
	})
	p := halted(partitions("shop-operator"))
	require.NotNil(t, p, "shop's operator sees its halted partition")
	require.Equal(t, "shop", p.Tenant)
	require.Equal(t, "client_orders", p.Group)
	require.NotNil(t, p.Halt)
	// The status page's row says what the operations API (and so
	// `partitions list`) says: owner, generation, pending, lag, and the
	// halt's attempts and generation.
	eventually(t, h, "the status page's halted row to agree with the API", func() (bool, string) {
		q := halted(partitions("admin"))
		_, page := f.request(t, h, "admin", "GET", "/", "")
		doc, err := htmltest.Parse(strings.NewReader(page))
		require.NoError(t, err)
		var cells []string
		for _, row := range doc.All("partition", "data-state", "halted") {
			if c := row.Cells(); len(c) == 8 && c[1] == "order:c-poison" {
				cells = c
			}
		}
		gen := "-"
		if q.Generation > 0 {
			gen = fmt.Sprint(q.Generation)
		}
		want := []string{"client_orders", "order:c-poison", "halted", cmp.Or(q.Owner, "-"), gen, fmt.Sprint(q.Pending), fmt.Sprint(q.Lag),
			fmt.Sprintf("%s (after %d attempt(s), generation %d)", q.Halt.Reason, q.Halt.Attempts, q.Halt.Generation)}
		return slices.Equal(cells, want), fmt.Sprintf("page %q, API %q", cells, want)
	})
	for _, q := range partitions("lab-operator") {
		require.NotEqual(t, "shop", q.Tenant, "lab's operator sees only lab's partitions: %+v", q)
	}

	_, refusal := f.request(t, h, "lab-operator", "GET", "/v1/plugins", "")
	for _, r := range []struct{ method, path, body string }{
		{"GET", "/v1/ops/partitions/order/c-poison", ""},
		{"POST", "/v1/ops/partitions/order/c-poison/skip", `{"reason":"not mine"}`},
		{"POST", "/v1/ops/partitions/order/c-poison/resume", `{"group":"client_orders"}`},
	} {
		code, body := f.request(t, h, "lab-operator", r.method, r.path, r.body)
		require.Equal(t, 403, code, "%s %s as lab's operator: %s", r.method, r.path, body)
		require.Equal(t, refusal, body, "the same answer as any refusal")
	}

	code, body := f.request(t, h, "shop-operator", "GET", "/v1/ops/partitions/order/c-poison", "")
	require.Equal(t, 200, code, body)
	var ds []ops.PartitionDetail
	require.NoError(t, json.Unmarshal([]byte(body), &ds))
	require.Len(t, ds, 1)
	require.Equal(t, "halted", ds[0].State)
	require.NotEmpty(t, ds[0].Entries)
	require.Equal(t, "halted", ds[0].Entries[0].State)

	code, body = f.request(t, h, "shop-operator", "POST", "/v1/ops/partitions/order/c-poison/skip", `{"reason":"a bad entry"}`)
	require.Equal(t, 200, code, body)
	var done ops.Done
	require.NoError(t, json.Unmarshal([]byte(body), &done))
	require.Equal(t, "shop", done.Tenant)
	eventually(t, h, "order:c-poison no longer halted", func() (bool, string) {
		ps := partitions("shop-operator")
		return halted(ps) == nil, fmt.Sprint(ps)
	})
	code, body = f.request(t, h, "shop-operator", "POST", "/v1/ops/partitions/order/c-poison/skip", "")
	require.Equal(t, 409, code, "the tenant's own partition, not halted: %s", body)

	entries := func(principal string) []audit.Entry {
		code, body := f.request(t, h, principal, "GET", "/v1/ops/audit", "")
		require.Equal(t, 200, code, body)
		var es []audit.Entry
		require.NoError(t, json.Unmarshal([]byte(body), &es), body)
		return es
	}
	shopKey := auth.KeyID(auth.Hash(f.keys["shop-operator"]))
	es := entries("shop-operator")
	require.Len(t, es, 2, "%+v", es)
	require.Equal(t, "partitions.skip", es[1].Action)
	require.Equal(t, "shop", es[1].Tenant)
	require.Equal(t, audit.OK, es[1].Outcome)
	require.Equal(t, "a bad entry", es[1].Reason)
	require.Contains(t, es[1].Principal, shopKey)
	require.Contains(t, es[0].Outcome, "not halted")
	require.Empty(t, entries("lab-operator"))
	require.Len(t, entries("admin"), 2)

	// The status page: each operator's part of it, the admin's whole.
	code, shopPage := f.request(t, h, "shop-operator", "GET", "/", "")
	require.Equal(t, 200, code)
	code, labPage := f.request(t, h, "lab-operator", "GET", "/", "")
	require.Equal(t, 200, code)
	code, adminPage := f.request(t, h, "admin", "GET", "/", "")
	require.Equal(t, 200, code)
	for _, c := range []struct {
		page, what string
		want       bool
	}{
		{shopPage, `data-handler="client_orders"`, true}, {shopPage, `data-handler="behave`, false},
		{shopPage, `data-group="client_orders"`, true}, {shopPage, `data-action="partitions.skip"`, true},
		{shopPage, `data-status="pending"`, false}, {shopPage, "tenant shop", true},
		{labPage, `data-handler="client_orders"`, false}, {labPage, `data-group="client_orders"`, false},
		{labPage, `data-action="partitions.skip"`, false}, {labPage, "tenant lab", true}, {labPage, `data-handler="behave"`, true},
		{adminPage, `data-handler="client_orders"`, true}, {adminPage, `data-action="partitions.skip"`, true},
		{adminPage, `data-status="pending"`, true},
		{shopPage, `data-tenant="shop"`, true}, {shopPage, `data-tenant="lab"`, false},
		{labPage, `data-tenant="shop"`, false}, {labPage, `data-tenant="lab"`, true},
		{adminPage, `data-tenant="shop"`, true}, {adminPage, `data-tenant="lab"`, true},
	} {
		require.Equal(t, c.want, strings.Contains(c.page, c.what), "%q in the page: want %v", c.what, c.want)
	}
}

// poisonedHost starts a host of the auth fixture's tenants on PostgreSQL
// and Redis, with a poison entry at the head of shop's partition
// order:c-poison (client_orders halts it).
func poisonedHost(t *testing.T) (*testHost, authFixture) {
	t.Helper()
	d := newRedisDeployment(t)
	f := newAuthFixture(t)
	h, err := startHostWith(t, "production.toml", f.dir, func(c *config.Config) { d.fastLeases(c); f.apply(c) })
	require.NoError(t, err)
	ctx := context.Background()
	opt, err := redis.ParseURL(d.redisURL)
	require.NoError(t, err)
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: d.prefix + "order:c-poison", Values: map[string]any{"not": "a message"}}).Err())
	require.NoError(t, rdb.SAdd(ctx, d.prefix+redispartition.IndexKey("order"), "c-poison").Err())
	return h, f
}

// TestDeadLettersAreTheTenants: on PostgreSQL and Redis, shop's operator
// moves its halted partition's head to order:c-poison:dlq; the dead
// letters then list it for shop's operator (source partition, not
// replayable) and through the CLI with --url, not for lab's, and its
// replay is refused as a conflict (replayed by hand) to shop, as
// forbidden to lab.
func TestDeadLettersAreTheTenants(t *testing.T) {
	h, f := poisonedHost(t)
	eventually(t, h, "order:c-poison halted", func() (bool, string) {
		code, body := f.request(t, h, "shop-operator", "POST", "/v1/ops/partitions/order/c-poison/dlq", `{"reason":"aside"}`)
		return code == 200, body
	})
	deadLetters := func(principal string) []ops.DeadLetter {
		t.Helper()
		code, body := f.request(t, h, principal, "GET", "/v1/ops/dead-letters", "")
		require.Equal(t, 200, code, body)
		var dls []ops.DeadLetter
		require.NoError(t, json.Unmarshal([]byte(body), &dls), body)
		return dls
	}
	dls := deadLetters("shop-operator")
	require.Len(t, dls, 1, "%+v", dls)
	dl := dls[0]
	require.Equal(t, "shop", dl.Tenant)
	require.Equal(t, "client_orders", dl.Group)
	require.Equal(t, "order:c-poison", dl.Stream)
	require.Equal(t, "partition", dl.Source)
	require.False(t, dl.Replayable)
	require.Empty(t, deadLetters("lab-operator"), "lab's operator sees only lab's dead letters")

	replay := "/v1/ops/dead-letters/order:c-poison/client_orders/" + dl.ID + "/replay"
	code, body := f.request(t, h, "shop-operator", "POST", replay, "")
	require.Equal(t, 409, code, body)
	require.Contains(t, body, "replayed by hand")
	code, body = f.request(t, h, "lab-operator", "POST", replay, "")
	require.Equal(t, 403, code, body)

	t.Setenv(envAPIKey, f.keys["shop-operator"])
	code, out, errs := cli(t, "dead-letters", "list", "--url", "http://"+h.addr)
	require.Equal(t, 0, code, errs)
	require.Regexp(t, `(?m)^shop\s+client_orders\s+order:c-poison\s+\S+\s+-\s+.*\s+partition\s+false$`, out)
	require.Contains(t, out, "1 dead letter(s) (at most 100 of each stream, the oldest)")
}
