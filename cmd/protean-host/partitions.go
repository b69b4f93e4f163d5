package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/ops"
	"github.com/proteanhq/protean-host/internal/ops/local"
	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/redisstream"
	"github.com/proteanhq/protean-host/internal/routes"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

const partitionsUsage = `usage: protean-host partitions list [--group NAME]
       protean-host partitions inspect CATEGORY KEY [--group NAME]
       protean-host partitions skip|dlq|resume CATEGORY KEY [--group NAME] [--by NAME] [--reason TEXT]
       (each also takes --url URL, with the key in $PROTEAN_API_KEY)

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
Every action is recorded in the audit log (protean-host audit) and on the
Redis stream protean:audit (without a database: on the stream only). A running host takes the partition
again on its next discovery pass. Without --url every subcommand loads the
plugins (--plugins) to place the partitions in their tenants.
` + remoteHelp

func cmdPartitions(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		return usagef("%s", strings.SplitN(partitionsUsage, "\n\n", 2)[0])
	}
	sub, args := args[0], args[1:]
	if sub == "-h" || sub == "--help" || sub == "-help" || sub == "help" {
		fmt.Fprint(e.stdout, partitionsUsage)
		return flag.ErrHelp
	}
	switch sub {
	case "list", "inspect", "skip", "dlq", "resume":
	default:
		return usagef("unknown subcommand %q\n%s", sub, strings.SplitN(partitionsUsage, "\n\n", 2)[0])
	}
	fs := e.flags("partitions " + sub)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), partitionsUsage, "\nflags:\n")
		fs.PrintDefaults()
	}
	var o operator
	o.bind(fs)
	group := fs.String("group", "", "the consumer group (handler) `NAME`")
	by := fs.String("by", os.Getenv("USER"), "who acts, for the audit record (with --url the host names the key instead)")
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
		return usagef("partitions %s takes %d arguments, got %d: %v\n%s", sub, want, len(pos), pos, strings.SplitN(partitionsUsage, "\n\n", 2)[0])
	}
	if err := o.parse(e, fs, nil); err != nil {
		return err
	}
	api, sc, closeAll, err := o.open(ctx, func(ctx context.Context) (*local.Service, func(), error) { return partitionOps(ctx, e) })
	if err != nil {
		return err
	}
	defer closeAll()
	switch sub {
	case "list":
		ps, err := api.Partitions(ctx, sc)
		if err != nil {
			return err
		}
		ps = slices.DeleteFunc(ps, func(p ops.Partition) bool { return *group != "" && p.Group != *group })
		return o.show(e, ps, func(w io.Writer) error { printPartitions(w, ps, *group); return nil })
	case "inspect":
		ds, err := api.Partition(ctx, sc, pos[0], pos[1])
		if err != nil {
			return err
		}
		ds = slices.DeleteFunc(ds, func(d ops.PartitionDetail) bool { return *group != "" && d.Group != *group })
		if len(ds) == 0 {
			return fmt.Errorf("no handler %s reads partitioned category %s, and %s is not halted in group %s", *group, pos[0],
				partition.PartitionUnit(pos[0], pos[1]), *group)
		}
		return o.show(e, ds, func(w io.Writer) error { printPartitionDetails(w, ds); return nil })
	}
	d, err := api.ActOnPartition(ctx, sc, ops.Act{Action: sub, By: cliActor(*by), Reason: *reason}, pos[0], pos[1], *group)
	if err != nil {
		return err
	}
	return o.show(e, d, func(w io.Writer) error { printDone(w, d); return nil })
}

// parseMixed parses flags that may come before, between or after the
// positional arguments, and returns those.
func parseMixed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// partitionOps is the operations API over the config's Redis broker, with
// the loaded plugins' partitions, broker groups and tenants, and the audit
// log in the database (none: kept in memory, so only the Redis stream
// protean:audit records a partition's action). A dead letter replayed
// here waits in its group's line for the running host.
func partitionOps(ctx context.Context, e *env) (*local.Service, func(), error) {
	adm, rdb, pool, closeAll, err := openAdmin(ctx, e)
	if err != nil {
		return nil, nil, err
	}
	dls, err := redisstream.New(rdb, redisstream.Options{Options: brokerOptions(e.cfg), Prefix: e.cfg.OutboxBroker().KeyPrefix, Consumer: cliActor("")})
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	set, err := e.loadSet(ctx)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	closeBoth := func() { set.Close(ctx); closeAll() }
	rt, tenancy := routes.Of(set, true), ops.TenancyOf(set)
	o := local.Options{Tenancy: func() ops.Tenancy { return tenancy }, Partitions: rt.Partitions,
		Admin: adm, BackfillSuffix: e.cfg.Server.PriorityLanes.BackfillSuffix, DeadLetters: dls, Outbox: outbox.NewMemory(nil), Audit: audit.NewMemory(nil)}
	if e.cfg.SubscriptionType() != config.SubscriptionEventStore {
		o.Groups = rt.Groups // the running host's broker groups
	}
	if pool != nil {
		o.Outbox, o.Audit = outbox.NewPostgres(pool, nil), audit.NewPostgres(pool)
	}
	s, err := local.New(o)
	if err != nil {
		closeBoth()
		return nil, nil, err
	}
	return s, closeBoth, nil
}

// openAdmin connects to the config's Redis broker (rdb) and, when the
// config has one, the PostgreSQL database holding the consumer positions
// (nil pool: none).
func openAdmin(ctx context.Context, e *env) (*redispartition.Admin, redis.UniversalClient, *pgxpool.Pool, func(), error) {
	cfg := e.cfg
	b := cfg.OutboxBroker()
	if b.Provider != config.ProviderRedis {
		return nil, nil, nil, nil, fmt.Errorf("brokers.%s.provider is %q: partitions live on a Redis broker only (provider = \"redis\")", cfg.Outbox.Broker, b.Provider)
	}
	ropts, err := redis.ParseURL(b.URI)
	if err != nil {
		return nil, nil, nil, nil, fmt.Errorf("brokers.%s.uri: %w", cfg.Outbox.Broker, err)
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
		return nil, nil, nil, nil, fmt.Errorf("connecting to Redis (brokers.%s.uri): %w", cfg.Outbox.Broker, err)
	}
	var positions position.Store
	var pool *pgxpool.Pool
	if _, err := postgresURI(cfg); err == nil {
		if pool, err = openMigratedPool(ctx, cfg); err != nil {
			closeAll()
			return nil, nil, nil, nil, err
		}
		closers = append(closers, pool.Close)
		positions = position.NewPostgres(pool, nil)
	} else if !errors.Is(err, errMemoryOnly) {
		closeAll()
		return nil, nil, nil, nil, err
	}
	adm, err := redispartition.NewAdmin(redispartition.AdminOptions{Redis: rdb, Prefix: b.KeyPrefix, Positions: positions,
		BackfillSuffix: cfg.Server.PriorityLanes.BackfillSuffix, Decode: redisstream.Decode})
	if err != nil {
		closeAll()
		return nil, nil, nil, nil, err
	}
	return adm, rdb, pool, closeAll, nil
}

// loadSet loads the plugins as one set, by the rules the running host
// uses; the caller closes it.
func (e *env) loadSet(ctx context.Context) (*host.Set, error) {
	l, err := e.loader(nil, false)
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
	return set, nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func haltLine(h *ops.Halt) string {
	return fmt.Sprintf("entry %s of %s (message %s) after %d attempt(s), halted at %s (generation %d): %s",
		h.Entry, h.Stream, dash(h.MessageID), h.Attempts, h.HaltedAt.Format(time.RFC3339), h.Generation, h.Reason)
}

func generation(g int64) string {
	if g > 0 {
		return fmt.Sprint(g)
	}
	return "-"
}

// printPartitions prints the partitions (of group, if set) as a table,
// then the halted ones' halt records.
func printPartitions(out io.Writer, ps []ops.Partition, group string) {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "CATEGORY\tKEY\tGROUP\tOWNER\tGEN\tPENDING\tLAG\tSTATE")
	var halted []ops.Partition
	n := 0
	for _, p := range ps {
		if group != "" && p.Group != group {
			continue
		}
		n++
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", p.Category, p.Key, p.Group, dash(p.Owner), generation(p.Generation), p.Pending, p.Lag, p.State)
		if p.Halt != nil {
			halted = append(halted, p)
		}
	}
	w.Flush()
	fmt.Fprintf(out, "%d partition(s), %d halted\n", n, len(halted))
	for _, p := range halted {
		fmt.Fprintf(out, "halted: %s %s group %s at %s\n", p.Category, p.Key, p.Group, haltLine(p.Halt))
	}
}

// printPartitionDetails prints each group's view of one partition: its
// state, halt record and head entries.
func printPartitionDetails(out io.Writer, ds []ops.PartitionDetail) {
	for i, d := range ds {
		if i > 0 {
			fmt.Fprintln(out)
		}
		fmt.Fprintf(out, "partition %s %s  group %s  state %s\n", d.Category, d.Key, d.Group, d.State)
		fmt.Fprintf(out, "owner %s  generation %s  pending %d  lag %d  streams %s\n", dash(d.Owner), generation(d.Generation), d.Pending, d.Lag, strings.Join(d.Streams, ", "))
		if d.Positions != nil {
			var ps []string
			for src, p := range d.Positions {
				ps = append(ps, fmt.Sprintf("%s=%d", src, p))
			}
			sort.Strings(ps)
			fmt.Fprintf(out, "positions %s\n", strings.Join(ps, " "))
		}
		if d.Halt != nil {
			fmt.Fprintf(out, "halted at %s\n", haltLine(d.Halt))
			fmt.Fprintf(out, "act with: protean-host partitions skip|dlq|resume %s %s --group %s\n", d.Category, d.Key, d.Group)
		}
		if len(d.Entries) == 0 {
			fmt.Fprintln(out, "no entries")
			continue
		}
		w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "STREAM\tENTRY\tSTATE\tDELIVERIES\tFAILURES\tMESSAGE\tTYPE\tGLOBAL\tDATA")
		for _, en := range d.Entries {
			data := en.Data
			if en.Problem != "" {
				data = "(" + en.Problem + ")"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%d\t%s\n", en.Stream, en.ID, en.State, en.Deliveries, en.Failures, dash(en.MessageID), dash(en.Type), en.GlobalPosition, data)
		}
		w.Flush()
	}
}
