package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/proteanhq/protean-host/internal/ops"
	"github.com/proteanhq/protean-host/outbox"
)

const outboxUsage = "usage: protean-host outbox status | outbox retry ID | outbox skip ID [--reason TEXT] [--config FILE] [--url URL]"

func cmdOutbox(ctx context.Context, e *env, args []string) error {
	known := len(args) > 0 && (args[0] == "status" || args[0] == "retry" || args[0] == "skip")
	switch {
	case !known && e.help:
		fmt.Fprint(e.stdout, outboxUsage, "\n", remoteHelp)
		return flag.ErrHelp
	case !known:
		return usagef("%s", outboxUsage)
	}
	sub, args := args[0], args[1:]
	fs := e.configFlags("outbox " + sub)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), outboxUsage, "\n", remoteHelp, "\nflags:\n")
		fs.PrintDefaults()
	}
	var o operator
	o.bind(fs)
	var reason *string
	if sub != "status" {
		reason = fs.String("reason", "", "why, for the audit record")
	}
	var id int64
	if sub != "status" && !e.help {
		// The ID comes first: protean-host outbox retry 42 --config FILE.
		if len(args) == 0 {
			return usagef("usage: protean-host outbox %s ID", sub)
		}
		n, err := strconv.ParseInt(args[0], 10, 64)
		if err != nil || n <= 0 {
			return usagef("outbox row ID %q must be a positive integer", args[0])
		}
		id, args = n, args[1:]
	}
	if err := o.parse(e, fs, args); err != nil {
		return err
	}
	api, sc, closeAll, err := o.open(ctx, databaseOps(e))
	if err != nil {
		return err
	}
	defer closeAll()
	if sub != "status" {
		d, err := api.ActOnOutbox(ctx, sc, ops.Act{Action: sub, By: cliActor(""), Reason: *reason}, id)
		if err != nil {
			return err
		}
		return o.show(e, d, func(w io.Writer) error { printDone(w, d); return nil })
	}
	st, err := api.Outbox(ctx, sc)
	if err != nil {
		return err
	}
	return o.show(e, st, func(w io.Writer) error { printOutbox(w, st); return nil })
}

// printOutbox prints the outbox's counts by status (a host tells them to
// an admin only), its oldest pending row's age, who holds each broker's
// relay lease, and its halted and abandoned rows.
func printOutbox(out io.Writer, st ops.Outbox) {
	if st.Counts != nil {
		w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "STATUS\tROWS")
		for _, s := range []outbox.Status{outbox.StatusPending, outbox.StatusProcessing, outbox.StatusFailed, outbox.StatusPublished,
			outbox.StatusHalted, outbox.StatusAbandoned} {
			fmt.Fprintf(w, "%s\t%d\n", s, st.Counts[string(s)])
		}
		w.Flush()
		if st.OldestPending != nil {
			fmt.Fprintf(out, "oldest pending: %s ago\n", time.Since(*st.OldestPending).Round(time.Millisecond))
		} else {
			fmt.Fprintln(out, "oldest pending: none")
		}
		for _, l := range st.RelayLeases {
			if left := time.Until(l.Expires); left > 0 {
				fmt.Fprintf(out, "relay lease of broker %s: %s claims its rows (lease for %s more unless renewed)\n", l.Broker, l.Owner, left.Round(time.Millisecond))
			} else {
				fmt.Fprintf(out, "relay lease of broker %s: free (%s's lapsed %s ago); the next relay to try takes it\n", l.Broker, l.Owner, (-left).Round(time.Millisecond))
			}
		}
	} else {
		fmt.Fprintln(out, "rows by status: not kept per tenant (an admin's key sees them)")
	}
	if len(st.Rows) > 0 {
		fmt.Fprintln(out, "halted and abandoned rows (a halted row holds back its key; retry with: protean-host outbox retry ID, or skip it: protean-host outbox skip ID):")
		w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tSTATUS\tCATEGORY\tKEY\tMESSAGE\tBROKER\tRETRIES\tCREATED\tLAST ERROR")
		for _, a := range st.Rows {
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", a.ID, a.Status, a.Category, cmp.Or(a.Key, "-"), a.MessageID, a.Broker,
				a.Retries, a.CreatedAt.Format(time.RFC3339), a.LastError)
		}
		w.Flush()
	}
}
