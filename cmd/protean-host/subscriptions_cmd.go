package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/proteanhq/protean-host/position"
	"github.com/proteanhq/protean-host/subscription"
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
          interval, then the messages held behind its key, in order)
  skip    give a failed or held message up (the held messages behind it
          then run)
`

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
	switch sub {
	case "retry", "skip":
		gp, err := strconv.ParseInt(pos[2], 10, 64)
		if err != nil || gp <= 0 {
			return fmt.Errorf("POSITION %q must be a positive integer", pos[2])
		}
		if err := failures.Mark(ctx, pos[0], pos[1], gp, sub); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "subscription %s/%s: message at %d marked for %s; its owner acts within its poll interval\n", pos[0], pos[1], gp, sub)
		return nil
	case "failed":
		fs, err := failures.List(ctx, *group, "", !*all)
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
	rows, err := position.NewPostgres(pool, nil).List(ctx, *group)
	if err != nil {
		return err
	}
	leases, head := subscription.NewPostgresLeases(pool), subscription.PostgresHead(pool)
	open, err := failures.List(ctx, *group, "", true)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "GROUP\tUNIT\tPOSITION\tHEAD\tLAG\tGENERATION\tOWNER\tLEASE\tOPEN FAILURES")
	for _, r := range rows {
		if strings.Contains(r.Unit, ":") {
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
		lease := "none"
		if ok {
			if left := time.Until(exp); left > 0 {
				lease = "expires in " + left.Round(time.Millisecond).String()
			} else {
				lease = "lapsed"
			}
		}
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
