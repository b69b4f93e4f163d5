package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/ops"
	"github.com/proteanhq/protean-host/internal/ops/local"
)

const deadLettersUsage = `usage: protean-host dead-letters list [--url URL]
       protean-host dead-letters replay STREAM GROUP ID [--by NAME] [--reason TEXT] [--url URL]

A dead letter is a message a consumer group gave up on (its retries used up,
timed out, or rejected by its handler), kept in the broker's dead-letter
queue, or a halted partition's head that an operator moved aside with
protean-host partitions dlq.

  list    the dead letters: tenant, group, stream, message id, type, reason,
          attempts, when it failed, where it came from (group or
          partition) and whether replay takes it; at most 100 of each
          stream, the oldest
  replay  move dead letter ID (the message id) of GROUP on STREAM back to
          the head of the group's line with fresh attempts; only a running
          broker group's

A partition's dead letter is not replayed here: the partition's workers read
by global position, not through the broker's requeue, so it is handled by
hand (its message is in the listing and on the stream CATEGORY:KEY:dlq).
Every replay is recorded in the audit log (protean-host audit). Without
--url the command reads the config's Redis broker and loads the plugins
(--plugins) to place the dead letters in their tenants; the inline broker
keeps its dead letters in the running host's memory: ask it with --url.
` + remoteHelp

func cmdDeadLetters(ctx context.Context, e *env, args []string) error {
	short := strings.SplitN(deadLettersUsage, "\n\n", 2)[0]
	if len(args) == 0 {
		return usagef("%s", short)
	}
	sub, args := args[0], args[1:]
	if sub == "-h" || sub == "--help" || sub == "-help" || sub == "help" {
		fmt.Fprint(e.stdout, deadLettersUsage)
		return flag.ErrHelp
	}
	want := map[string]int{"list": 0, "replay": 3}
	n, ok := want[sub]
	if !ok {
		return usagef("unknown subcommand %q\n%s", sub, short)
	}
	fs := e.flags("dead-letters " + sub)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), deadLettersUsage, "\nflags:\n")
		fs.PrintDefaults()
	}
	var o operator
	o.bind(fs)
	by := fs.String("by", os.Getenv("USER"), "who acts, for the audit record (with --url the host names the key instead)")
	reason := fs.String("reason", "", "why, for the audit record")
	pos, err := parseMixed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != n {
		return usagef("dead-letters %s takes %d arguments, got %d: %v\n%s", sub, n, len(pos), pos, short)
	}
	if err := o.parse(e, fs, nil); err != nil {
		return err
	}
	api, sc, closeAll, err := o.open(ctx, func(ctx context.Context) (*local.Service, func(), error) {
		if b := e.cfg.OutboxBroker(); b.Provider != config.ProviderRedis {
			return nil, nil, fmt.Errorf("brokers.%s.provider is %q: the inline broker's dead letters live in the running host's memory: ask it with --url", e.cfg.Outbox.Broker, b.Provider)
		}
		return partitionOps(ctx, e)
	})
	if err != nil {
		return err
	}
	defer closeAll()
	if sub == "list" {
		dls, err := api.DeadLetters(ctx, sc)
		if err != nil {
			return err
		}
		return o.show(e, dls, func(w io.Writer) error { return printDeadLetters(w, dls) })
	}
	d, err := api.ReplayDeadLetter(ctx, sc, ops.Act{Action: "replay", By: cliActor(*by), Reason: *reason}, pos[0], pos[1], pos[2])
	if err != nil {
		return err
	}
	return o.show(e, d, func(w io.Writer) error { printDone(w, d); return nil })
}

// printDeadLetters prints dead letters as a table, then their data.
func printDeadLetters(out io.Writer, dls []ops.DeadLetter) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "TENANT\tGROUP\tSTREAM\tID\tTYPE\tREASON\tATTEMPTS\tFAILED AT\tSOURCE\tREPLAYABLE")
	for _, d := range dls {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%v\n", dash(d.Tenant), d.Group, d.Stream, d.ID, dash(d.Type), dash(d.Reason), d.Attempts,
			d.FailedAt.Format(time.RFC3339), d.Source, d.Replayable)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d dead letter(s) (at most %d of each stream, the oldest)\n", len(dls), ops.MaxDeadLetters)
	for _, d := range dls {
		if d.Data != "" {
			fmt.Fprintf(out, "data of %s %s %s: %s\n", d.Stream, d.Group, d.ID, d.Data)
		}
	}
	return nil
}
