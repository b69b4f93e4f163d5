package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/position"
)

const subscriptionsUsage = `usage: protean-host subscriptions list [--group NAME]
       protean-host subscriptions failed [--group NAME] [--all]
       protean-host subscriptions retry|skip GROUP UNIT POSITION

Event-store subscriptions (server.default_subscription_type = "event_store")
read a category (UNIT, or $all) in global position order. A message that
fails past server.stream_subscription.max_retries is recorded and skipped;
in a category with a sequential_by key, the later messages of its key are
held behind it.

  list    every subscription's position, lease holder, head and lag
  failed  the open failure records (failed, held, retry); --all adds the
          resolved and skipped ones
  retry   run a failed message again (the owner reruns it within its poll
          interval, longer when it holds many open records: at most a
          tenth of its time goes to reading them; then the messages held
          behind its key, in order)
  skip    give a failed or held message up (the held messages behind it
          then run)
`

// cmdSubscriptions parses a subscriptions subcommand and its arguments, then
// runs it against the migrated PostgreSQL store.
func cmdSubscriptions(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		return errors.New(strings.SplitN(subscriptionsUsage, "\n\n", 2)[0])
	}
	sub, args := args[0], args[1:]
	if sub == "-h" || sub == "--help" || sub == "help" {
		fmt.Fprint(e.stderr, subscriptionsUsage)
		return nil
	}
	switch sub {
	case "list", "failed", "retry", "skip":
	default:
		return fmt.Errorf("unknown subcommand %q\n%s", sub, strings.SplitN(subscriptionsUsage, "\n\n", 2)[0])
	}
	fs := e.flags("subscriptions " + sub)
	group := fs.String("group", "", "only the consumer group (handler) `NAME`")
	all := fs.Bool("all", false, "failed: also the resolved and skipped records")
	pos, err := parseMixed(fs, args)
	if err != nil {
		return err
	}
	want := 0
	if sub == "retry" || sub == "skip" {
		want = 3
	}
	if len(pos) != want {
		return fmt.Errorf("subscriptions %s takes %d arguments, got %d: %v\n%s", sub, want, len(pos), pos, strings.SplitN(subscriptionsUsage, "\n\n", 2)[0])
	}
	if err := e.parse(fs, nil); err != nil {
		return err
	}
	pool, err := openMigratedPool(ctx, e.cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	failures := subscription.NewPostgresFailures(pool)
	if *group != "" && (sub == "list" || sub == "failed") {
		if err := knownGroup(ctx, pool, failures, *group); err != nil {
			return err
		}
	}
	switch sub {
	case "retry", "skip":
		return subscriptionsMark(ctx, e, failures, sub, pos)
	case "failed":
		return subscriptionsFailed(ctx, e, failures, *group, *all)
	}
	return subscriptionsList(ctx, e, pool, failures, *group)
}

// subscriptionsMark runs retry or skip (sub): it marks the failure record at
// GROUP UNIT POSITION (pos) for the owner to act on.
func subscriptionsMark(ctx context.Context, e *env, failures *subscription.PostgresFailures, sub string, pos []string) error {
	gp, err := strconv.ParseInt(pos[2], 10, 64)
	if err != nil || gp <= 0 {
		return fmt.Errorf("POSITION %q must be a positive integer", pos[2])
	}
	if err := failures.Mark(ctx, pos[0], pos[1], gp, sub); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "subscription %s/%s: message at %d marked for %s; its owner acts within its poll interval\n", pos[0], pos[1], gp, sub)
	return nil
}

// subscriptionsFailed runs failed: a table of the group's open failure
// records, or of all of them with all.
func subscriptionsFailed(ctx context.Context, e *env, failures *subscription.PostgresFailures, group string, all bool) error {
	fs, err := failures.List(ctx, group, "", !all)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "GROUP\tUNIT\tPOSITION\tSTATUS\tKEY\tTYPE\tSTREAM\tATTEMPTS\tFAILED\tERROR")
	for _, f := range fs {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", f.Group, f.Unit, f.GlobalPosition, f.Status, f.Key, f.Type,
			f.Stream, f.Attempts, f.FailedAt.Format(time.RFC3339), f.Error)
	}
	return w.Flush()
}

// subscriptionsList runs list: a table of every event-store subscription's
// position, head, lag, lease and open failures (the group's only, if set).
func subscriptionsList(ctx context.Context, e *env, pool *pgxpool.Pool, failures *subscription.PostgresFailures, group string) error {
	rows, err := position.NewPostgres(pool, nil).List(ctx, group)
	if err != nil {
		return err
	}
	leases, head := subscription.NewPostgresLeases(pool), subscription.PostgresHead(pool)
	open, err := failures.List(ctx, group, "", true)
	if err != nil {
		return err
	}
	isSub, err := subscriptionUnits(ctx, pool, rows)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "GROUP\tUNIT\tPOSITION\tHEAD\tLAG\tGENERATION\tOWNER\tLEASE\tOPEN FAILURES")
	for _, r := range rows {
		if !isSub(r.Unit) {
			continue // a Redis partition's row: protean-host partitions list
		}
		p := r.Positions[r.Unit]
		h, err := head(ctx, r.Unit)
		if err != nil {
			return err
		}
		owner, exp, ok, err := leases.Holder(ctx, r.Group, r.Unit)
		if err != nil {
			return err
		}
		lease := leaseState(exp, ok)
		n := 0
		for _, f := range open {
			if f.Group == r.Group && f.Unit == r.Unit {
				n++
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%d\n", r.Group, r.Unit, p, h, max(h-p, 0), r.Generation, owner, lease, n)
	}
	return w.Flush()
}

// leaseState says how a lease that expires at exp stands: "none" when
// nobody holds it (!held), the time left, or "lapsed".
func leaseState(exp time.Time, held bool) string {
	if !held {
		return "none"
	}
	if left := time.Until(exp); left > 0 {
		return "expires in " + left.Round(time.Millisecond).String()
	}
	return "lapsed"
}

// subscriptionUnits tells the event-store subscriptions' rows of the
// positions table from the Redis partitions' and process managers'. A
// subscription's unit is a category (or $all); a partition's is
// "{category}:{key}", a process manager's "{pm}:{correlation}". A colon
// alone does not decide it: Protean's categories hold "::" ("test::order")
// and MessageDB's may hold ":" ("account:command"). So a unit is a
// subscription's when every colon in it is part of a "::", or, failing
// that, when the event store has events of that category (one query for
// all such units; a partition's "{category}:{key}" is never a stream's
// category, a stream being "{category}-{id}").
func subscriptionUnits(ctx context.Context, pool *pgxpool.Pool, rows []position.Row) (func(unit string) bool, error) {
	plain := func(unit string) bool {
		return unit == subscription.All || !strings.Contains(strings.ReplaceAll(unit, "::", ""), ":")
	}
	var ask []string
	for _, r := range rows {
		if !plain(r.Unit) {
			ask = append(ask, r.Unit)
		}
	}
	slices.Sort(ask)
	ask = slices.Compact(ask)
	cats := map[string]bool{}
	if len(ask) > 0 {
		rs, err := pool.Query(ctx, `SELECT u FROM unnest($1::text[]) AS u
			WHERE EXISTS (SELECT 1 FROM message_store.messages WHERE message_store.category(stream_name) = u)`, ask)
		if err != nil {
			return nil, fmt.Errorf("subscriptions list: categories of the units: %w", err)
		}
		found, err := pgx.CollectRows(rs, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("subscriptions list: categories of the units: %w", err)
		}
		for _, c := range found {
			cats[c] = true
		}
	}
	return func(unit string) bool { return plain(unit) || cats[unit] }, nil
}

// knownGroup refuses a --group no event-store subscription has run under
// (no row in the positions table, no failure record), so that a typo is
// not read as a group that is caught up and has no failures.
func knownGroup(ctx context.Context, pool *pgxpool.Pool, failures *subscription.PostgresFailures, group string) error {
	rows, err := position.NewPostgres(pool, nil).List(ctx, group)
	if err != nil {
		return err
	}
	isSub, err := subscriptionUnits(ctx, pool, rows)
	if err != nil {
		return err
	}
	for _, r := range rows {
		if isSub(r.Unit) {
			return nil
		}
	}
	recs, err := failures.List(ctx, group, "", false)
	if err != nil {
		return err
	}
	if len(recs) > 0 {
		return nil
	}
	return fmt.Errorf("group %q: no event-store subscription has run under that name (a group is its handler's name; subscriptions list shows them all)", group)
}
