package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/internal/ops"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/position"
)

const subscriptionsUsage = `usage: protean-host subscriptions list [--group NAME]
       protean-host subscriptions failed [--group NAME] [--all]
       protean-host subscriptions retry|skip GROUP UNIT POSITION [--reason TEXT]
       (each also takes --url URL, with the key in $PROTEAN_API_KEY)

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

Without --url, list shows every subscription with a row in the positions
table, of handlers no longer loaded too; a host's list (--url) shows the
subscriptions of its running handlers only.
` + remoteHelp

// cmdSubscriptions parses a subscriptions subcommand and its arguments, then
// runs it against the migrated PostgreSQL store, or a host's API (--url).
func cmdSubscriptions(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		return usagef("%s", strings.SplitN(subscriptionsUsage, "\n\n", 2)[0])
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "list", "failed", "retry", "skip":
	case "-h", "--help", "-help", "help":
		fmt.Fprint(e.stdout, subscriptionsUsage)
		return flag.ErrHelp
	default:
		return usagef("unknown subcommand %q\n%s", sub, strings.SplitN(subscriptionsUsage, "\n\n", 2)[0])
	}
	// Each subcommand's own flags: the others' are refused.
	fs := e.configFlags("subscriptions " + sub)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), subscriptionsUsage, "\nflags:\n")
		fs.PrintDefaults()
	}
	var o operator
	o.bind(fs)
	group := fs.String("group", "", "only the consumer group (handler) `NAME`")
	all, reason := new(bool), new(string)
	switch sub {
	case "failed":
		all = fs.Bool("all", false, "also the resolved and skipped records")
	case "retry", "skip":
		reason = fs.String("reason", "", "why, for the audit record")
	}
	pos, err := parseMixed(fs, args)
	if err != nil {
		return err
	}
	want := 0
	if sub == "retry" || sub == "skip" {
		want = 3
	}
	if len(pos) != want {
		return usagef("subscriptions %s takes %d arguments, got %d: %v\n%s", sub, want, len(pos), pos, strings.SplitN(subscriptionsUsage, "\n\n", 2)[0])
	}
	var gp int64
	if want == 3 {
		if gp, err = strconv.ParseInt(pos[2], 10, 64); err != nil || gp <= 0 {
			return usagef("POSITION %q must be a positive integer", pos[2])
		}
	}
	if err := o.parse(e, fs, nil); err != nil {
		return err
	}
	api, sc, closeAll, err := o.open(ctx, databaseOps(e))
	if err != nil {
		return err
	}
	defer closeAll()
	if *group != "" {
		if err := knownGroup(ctx, api, sc, *group); err != nil {
			return err
		}
	}
	switch sub {
	case "retry", "skip":
		d, err := api.ActOnFailure(ctx, sc, ops.Act{Action: sub, By: cliActor(""), Reason: *reason}, pos[0], pos[1], gp)
		if err != nil {
			return err
		}
		return o.show(e, d, func(w io.Writer) error { printDone(w, d); return nil })
	case "failed":
		recs, err := api.Failures(ctx, sc, *all)
		if err != nil {
			return err
		}
		recs = slices.DeleteFunc(recs, func(f ops.Failure) bool { return *group != "" && f.Group != *group })
		return o.show(e, recs, func(w io.Writer) error { return printFailures(w, recs) })
	}
	subs, err := api.Subscriptions(ctx, sc)
	if err != nil {
		return err
	}
	subs = slices.DeleteFunc(subs, func(s ops.Subscription) bool { return *group != "" && s.Group != *group })
	return o.show(e, subs, func(w io.Writer) error { return printSubscriptions(w, subs) })
}

// printFailures prints failure records as a table.
func printFailures(out io.Writer, fs []ops.Failure) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "GROUP\tUNIT\tPOSITION\tSTATUS\tKEY\tTYPE\tSTREAM\tATTEMPTS\tFAILED\tERROR")
	for _, f := range fs {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", f.Group, f.Unit, f.Position, f.Status, f.Key, f.Type,
			f.Stream, f.Attempts, f.FailedAt.Format(time.RFC3339), f.Error)
	}
	return w.Flush()
}

// printSubscriptions prints event-store subscriptions as a table: position,
// head, lag, lease and open failures.
func printSubscriptions(out io.Writer, subs []ops.Subscription) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "GROUP\tUNIT\tPOSITION\tHEAD\tLAG\tGENERATION\tOWNER\tLEASE\tOPEN FAILURES")
	for _, s := range subs {
		var exp time.Time
		if s.LeaseExpires != nil {
			exp = *s.LeaseExpires
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%d\n", s.Group, s.Unit, s.Position, s.Head, s.Lag, s.Generation, s.Owner,
			leaseState(exp, s.LeaseExpires != nil), s.OpenFailures)
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
// (none listed, no failure record), so that a typo is not read as a group
// that is caught up and has no failures.
func knownGroup(ctx context.Context, api ops.API, sc ops.Scope, group string) error {
	subs, err := api.Subscriptions(ctx, sc)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(subs, func(s ops.Subscription) bool { return s.Group == group }) {
		return nil
	}
	fs, err := api.Failures(ctx, sc, true)
	if err != nil {
		return err
	}
	if slices.ContainsFunc(fs, func(f ops.Failure) bool { return f.Group == group }) {
		return nil
	}
	return fmt.Errorf("group %q: no event-store subscription has run under that name (a group is its handler's name; subscriptions list shows them all)", group)
}
