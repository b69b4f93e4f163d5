package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/redisstream"
	"github.com/proteanhq/protean-host/internal/routes"
	"github.com/proteanhq/protean-host/internal/schema"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

const partitionsUsage = `usage: protean-host partitions list [--group NAME]
       protean-host partitions inspect CATEGORY KEY [--group NAME]
       protean-host partitions skip|dlq|resume CATEGORY KEY [--group NAME] [--by NAME] [--reason TEXT]

A partition halts when a message fails max_retries times (or cannot be
decoded): its lease is released, no instance takes it until an operator acts,
and the message stays pending at its head.

  list     every partition of every handler reading a partitioned category
           (from the plugins), and every halted one: owner, generation,
           pending, lag and state
  inspect  one partition's state, halt record and head entries
  skip     ack the halted message (it is never handled) and release the
           partition
  dlq      copy the halted message to CATEGORY:KEY:dlq, then ack it and
           release the partition
  resume   release the partition with fresh attempts at the halted message

For a process manager with sequential_by = true, CATEGORY is the process
manager's name and KEY the correlation value. skip, dlq and resume act on
the one group the partition is halted in; --group chooses when several are.
Every action is recorded on the Redis stream protean:audit. A running host
takes the partition again on its next discovery pass.
`

func cmdPartitions(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		return errors.New(strings.SplitN(partitionsUsage, "\n\n", 2)[0])
	}
	sub, args := args[0], args[1:]
	if sub == "-h" || sub == "--help" || sub == "help" {
		fmt.Fprint(e.stderr, partitionsUsage)
		return nil
	}
	switch sub {
	case "list", "inspect", "skip", "dlq", "resume":
	default:
		return fmt.Errorf("unknown subcommand %q\n%s", sub, strings.SplitN(partitionsUsage, "\n\n", 2)[0])
	}
	fs := e.flags("partitions " + sub)
	fs.Usage = func() {
		fmt.Fprint(e.stderr, partitionsUsage, "\nflags:\n")
		fs.PrintDefaults()
	}
	group := fs.String("group", "", "the consumer group (handler) `NAME`")
	by := fs.String("by", os.Getenv("USER"), "who acts, for the audit record")
	reason := fs.String("reason", "", "why, for the audit record")
	pos, err := parseMixed(fs, args)
	if err != nil {
		return err
	}
	want := 2
	if sub == "list" {
		want = 0
	}
	if len(pos) != want {
		return fmt.Errorf("partitions %s takes %d arguments, got %d: %v\n%s", sub, want, len(pos), pos, strings.SplitN(partitionsUsage, "\n\n", 2)[0])
	}
	if err := e.parse(fs, nil); err != nil {
		return err
	}
	adm, closeAll, err := openAdmin(ctx, e)
	if err != nil {
		return err
	}
	defer closeAll()
	switch sub {
	case "list":
		subs, err := e.subscriptions(ctx)
		if err != nil {
			return err
		}
		return partitionsList(ctx, e, adm, subs, *group)
	case "inspect":
		subs, err := e.subscriptions(ctx)
		if err != nil {
			return err
		}
		return partitionsInspect(ctx, e, adm, subs, *group, pos[0], pos[1])
	}
	if *by == "" {
		*by = "operator"
	}
	return partitionsAct(ctx, e, adm, sub, *group, pos[0], pos[1], redispartition.Operator{By: *by, Reason: *reason})
}

// parseMixed parses flags that may come before, between or after the
// positional arguments, and returns those.
func parseMixed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// openAdmin connects to the config's Redis broker and, when the config has
// one, the PostgreSQL database holding the consumer positions.
func openAdmin(ctx context.Context, e *env) (*redispartition.Admin, func(), error) {
	cfg := e.cfg
	b := cfg.OutboxBroker()
	if b.Provider != config.ProviderRedis {
		return nil, nil, fmt.Errorf("brokers.%s.provider is %q: partitions live on a Redis broker only (provider = \"redis\")", cfg.Outbox.Broker, b.Provider)
	}
	ropts, err := redis.ParseURL(b.URI)
	if err != nil {
		return nil, nil, fmt.Errorf("brokers.%s.uri: %w", cfg.Outbox.Broker, err)
	}
	rdb := redis.NewClient(ropts)
	closers := []func(){func() { _ = rdb.Close() }}
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		closeAll()
		return nil, nil, fmt.Errorf("connecting to Redis (brokers.%s.uri): %w", cfg.Outbox.Broker, err)
	}
	var positions position.Store
	if _, err := postgresURI(cfg); err == nil {
		pool, err := openPool(ctx, cfg)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		closers = append(closers, pool.Close)
		if err := schema.Check(ctx, pool); err != nil {
			closeAll()
			return nil, nil, err
		}
		positions = position.NewPostgres(pool, nil)
	} else if !errors.Is(err, errMemoryOnly) {
		closeAll()
		return nil, nil, err
	}
	adm, err := redispartition.NewAdmin(redispartition.AdminOptions{Redis: rdb, Prefix: b.KeyPrefix, Positions: positions,
		BackfillSuffix: cfg.Server.PriorityLanes.BackfillSuffix, Decode: redisstream.Decode})
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return adm, closeAll, nil
}

// subscriptions loads the plugins and lists their consumer groups on
// partitioned categories, by the rule the running host uses
// (routes.Table.Partitions): every handler but a command handler that
// reads a partitioned category; a process manager with sequential_by = true
// owns a correlation value across its categories.
func (e *env) subscriptions(ctx context.Context) ([]partition.Subscription, error) {
	l, err := e.loader(nil)
	if err != nil {
		return nil, err
	}
	defer l.Close(ctx)
	set, errs := host.LoadSet(ctx, l, e.cfg.Plugins.Dir, e.broker())
	if len(errs) > 0 {
		for _, err := range errs {
			fmt.Fprintln(e.stderr, err)
		}
		return nil, fmt.Errorf("%d problem(s) in %s", len(errs), e.cfg.Plugins.Dir)
	}
	defer set.Close(ctx)
	return routes.Of(set, true).Partitions(), nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func haltLine(h *redispartition.Halt) string {
	return fmt.Sprintf("entry %s of %s (message %s) after %d attempt(s), halted at %s (generation %d): %s",
		h.Entry, h.Stream, dash(h.MessageID), h.Attempts, h.HaltedAt.Format(time.RFC3339), h.Generation, h.Reason)
}

func partitionsList(ctx context.Context, e *env, adm *redispartition.Admin, subs []partition.Subscription, group string) error {
	sts, err := adm.List(ctx, subs)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "CATEGORY\tKEY\tGROUP\tOWNER\tGEN\tPENDING\tLAG\tSTATE")
	var halted []redispartition.Status
	n := 0
	for _, s := range sts {
		if group != "" && s.Group != group {
			continue
		}
		n++
		gen := "-"
		if s.Generation > 0 {
			gen = fmt.Sprint(s.Generation)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", s.Category, s.Key, s.Group, dash(s.Owner), gen, s.Pending, s.Lag, s.State())
		if s.Halt != nil {
			halted = append(halted, s)
		}
	}
	w.Flush()
	fmt.Fprintf(e.stdout, "%d partition(s), %d halted\n", n, len(halted))
	for _, s := range halted {
		fmt.Fprintf(e.stdout, "halted: %s %s group %s at %s\n", s.Category, s.Key, s.Group, haltLine(s.Halt))
	}
	return nil
}

// candidates returns the subscriptions a unit named CATEGORY KEY belongs
// to: handlers reading the partitioned category, or the correlated process
// manager named CATEGORY.
func candidates(subs []partition.Subscription, category, group string) []partition.Subscription {
	var out []partition.Subscription
	for _, s := range subs {
		if group != "" && s.Group != group {
			continue
		}
		if (s.Correlated && s.Group == category) || (!s.Correlated && containsString(s.Categories, category)) {
			out = append(out, s)
		}
	}
	return out
}

// unitOf names the partition of key in category, refusing a pair that is
// not read back as itself (a key with a colon, an empty one): the unit
// would name another partition.
func unitOf(category, key, backfillSuffix string) (string, error) {
	unit := partition.PartitionUnit(category, key)
	c, k, err := partition.ParseUnit(unit, backfillSuffix)
	if err == nil && (c != category || k != key) {
		err = fmt.Errorf("%w: category %q and key %q name partition %q of category %q", partition.ErrInvalidUnit, category, key, k, c)
	}
	return unit, err
}

func containsString(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func partitionsInspect(ctx context.Context, e *env, adm *redispartition.Admin, subs []partition.Subscription, group, category, key string) error {
	unit, err := unitOf(category, key, e.cfg.Server.PriorityLanes.BackfillSuffix)
	if err != nil {
		return err
	}
	cs := candidates(subs, category, group)
	if len(cs) == 0 {
		// No loaded handler names it: a halted unit of a removed handler
		// is still worth seeing.
		groups, err := adm.HaltedGroups(ctx, unit)
		if err != nil {
			return err
		}
		for _, g := range groups {
			if group == "" || g == group {
				cs = append(cs, partition.Subscription{Group: g, Categories: []string{category}})
			}
		}
	}
	if len(cs) == 0 {
		if group != "" {
			return fmt.Errorf("no handler %s reads partitioned category %s, and %s is not halted in group %s", group, category, unit, group)
		}
		return fmt.Errorf("no handler reads partitioned category %s (or is a correlated process manager of that name), and %s is not halted in any group", category, unit)
	}
	for i, s := range cs {
		if i > 0 {
			fmt.Fprintln(e.stdout)
		}
		d, err := adm.Inspect(ctx, s, unit)
		if err != nil {
			return err
		}
		gen := "-"
		if d.Generation > 0 {
			gen = fmt.Sprint(d.Generation)
		}
		fmt.Fprintf(e.stdout, "partition %s %s  group %s  state %s\n", d.Category, d.Key, d.Group, d.State())
		fmt.Fprintf(e.stdout, "owner %s  generation %s  pending %d  lag %d  streams %s\n", dash(d.Owner), gen, d.Pending, d.Lag, strings.Join(d.Sources, ", "))
		if d.Positions != nil {
			var ps []string
			for src, p := range d.Positions {
				ps = append(ps, fmt.Sprintf("%s=%d", src, p))
			}
			sort.Strings(ps)
			fmt.Fprintf(e.stdout, "positions %s\n", strings.Join(ps, " "))
		}
		if d.Halt != nil {
			fmt.Fprintf(e.stdout, "halted at %s\n", haltLine(d.Halt))
			fmt.Fprintf(e.stdout, "act with: protean-host partitions skip|dlq|resume %s %s --group %s\n", category, key, d.Group)
		}
		if len(d.Entries) == 0 {
			fmt.Fprintln(e.stdout, "no entries")
			continue
		}
		w := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "STREAM\tENTRY\tSTATE\tDELIVERIES\tFAILURES\tMESSAGE\tTYPE\tGLOBAL\tDATA")
		for _, en := range d.Entries {
			state := "new"
			switch {
			case en.Halted:
				state = "halted"
			case en.Pending:
				state = "pending"
			}
			data := en.Data
			if en.Problem != "" {
				data = "(" + en.Problem + ")"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%d\t%s\n", en.Stream, en.ID, state, en.Deliveries, en.Failures, dash(en.MessageID), dash(en.Type), en.GlobalPosition, data)
		}
		w.Flush()
	}
	return nil
}

func partitionsAct(ctx context.Context, e *env, adm *redispartition.Admin, action, group, category, key string, op redispartition.Operator) error {
	unit, err := unitOf(category, key, e.cfg.Server.PriorityLanes.BackfillSuffix)
	if err != nil {
		return err
	}
	if group == "" {
		groups, err := adm.HaltedGroups(ctx, unit)
		if err != nil {
			return err
		}
		switch len(groups) {
		case 0:
			return fmt.Errorf("partition %s is not halted in any consumer group", unit)
		case 1:
			group = groups[0]
		default:
			return fmt.Errorf("partition %s is halted in groups %s: choose one with --group", unit, strings.Join(groups, ", "))
		}
	}
	var out redispartition.Outcome
	switch action {
	case "skip":
		out, err = adm.Skip(ctx, group, unit, op)
	case "dlq":
		out, err = adm.DLQ(ctx, group, unit, op)
	default:
		out, err = adm.Resume(ctx, group, unit, op)
	}
	if err != nil {
		return err
	}
	h := out.Halt
	switch action {
	case "skip":
		fmt.Fprintf(e.stdout, "skipped entry %s of %s (message %s) for group %s; acked: %v\n", h.Entry, h.Stream, dash(h.MessageID), group, out.Acked)
	case "dlq":
		fmt.Fprintf(e.stdout, "moved entry %s of %s (message %s) for group %s to %s as %s\n", h.Entry, h.Stream, dash(h.MessageID), group, out.DLQStream, out.DLQEntry)
	default:
		fmt.Fprintf(e.stdout, "resumed %s for group %s: entry %s (message %s) is retried with fresh attempts\n", unit, group, h.Entry, dash(h.MessageID))
	}
	fmt.Fprintf(e.stdout, "partition %s released for group %s; audit record %s on %s\n", unit, group, out.AuditEntry, redispartition.AuditStream)
	return nil
}
