package main

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/proteanhq/protean-host/outbox"
)

func cmdOutbox(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || (args[0] != "status" && args[0] != "retry" && args[0] != "skip") {
		return fmt.Errorf("usage: protean-host outbox status | outbox retry ID | outbox skip ID [--config FILE]")
	}
	sub, args := args[0], args[1:]
	fs := e.flags("outbox " + sub)
	var id int64
	if sub != "status" {
		// The ID comes first: protean-host outbox retry 42 --config FILE.
		if len(args) == 0 {
			return fmt.Errorf("usage: protean-host outbox %s ID", sub)
		}
		n, err := strconv.ParseInt(args[0], 10, 64)
		if err != nil || n <= 0 {
			return fmt.Errorf("outbox row ID %q must be a positive integer", args[0])
		}
		id, args = n, args[1:]
	}
	if err := e.parse(fs, args); err != nil {
		return err
	}
	pool, err := openMigratedPool(ctx, e.cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store := outbox.NewPostgres(pool, nil)
	switch sub {
	case "retry":
		if err := store.Retry(ctx, id); err != nil {
			return fmt.Errorf("outbox row %d: %w", id, err)
		}
		fmt.Fprintf(e.stdout, "outbox row %d is pending again\n", id)
		return nil
	case "skip":
		// A halted row holds back its key; skipping it lets the key's
		// later rows go on without it. Its event stays in the event
		// store; no consumer of the broker will see it.
		r, err := store.Get(ctx, id)
		if err != nil {
			return err
		}
		if r.Status != outbox.StatusHalted && r.Status != outbox.StatusFailed {
			return fmt.Errorf("outbox row %d is %s: only a halted or failed row can be skipped: %w", id, r.Status, outbox.ErrStatus)
		}
		if err := store.Abandon(ctx, id, "skipped by an operator (outbox skip)"); err != nil {
			return fmt.Errorf("outbox row %d: %w", id, err)
		}
		fmt.Fprintf(e.stdout, "outbox row %d skipped (abandoned): the later rows of its key go on without it\n", id)
		return nil
	}
	st, err := store.Stats(ctx)
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "STATUS\tROWS")
	for _, s := range []outbox.Status{outbox.StatusPending, outbox.StatusProcessing, outbox.StatusFailed, outbox.StatusPublished,
		outbox.StatusHalted, outbox.StatusAbandoned} {
		fmt.Fprintf(w, "%s\t%d\n", s, st.Counts[s])
	}
	w.Flush()
	if st.OldestPending != nil {
		fmt.Fprintf(e.stdout, "oldest pending: %s ago\n", time.Since(*st.OldestPending).Round(time.Millisecond))
	} else {
		fmt.Fprintln(e.stdout, "oldest pending: none")
	}
	if len(st.Abandoned) > 0 {
		fmt.Fprintln(e.stdout, "halted and abandoned rows (a halted row holds back its key; retry with: protean-host outbox retry ID, or skip it: protean-host outbox skip ID):")
		w = tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(w, "ID\tSTATUS\tCATEGORY\tKEY\tMESSAGE\tBROKER\tRETRIES\tCREATED\tLAST ERROR")
		for _, a := range st.Abandoned {
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", a.ID, a.Status, a.Category, cmp.Or(a.Key, "-"), a.MessageID, a.TargetBroker,
				a.RetryCount, a.CreatedAt.Format(time.RFC3339), a.LastError)
		}
		w.Flush()
	}
	return nil
}
