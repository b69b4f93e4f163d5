package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/ops"
	"github.com/proteanhq/protean-host/internal/ops/local"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/position"
)

// The operator commands (partitions, subscriptions, outbox, dead-letters,
// audit) speak to one interface, ops.API: a running host's over HTTP with
// --url, or an local.Service over the config's stores. Each view has one
// printing function, so the output is the same either way.

// remoteHelp is the operator commands' usage of --url.
const remoteHelp = `
With --url URL (or the environment variable PROTEAN_URL) the command asks a
running host's operations API (/v1/ops) instead of opening the stores, with
the API key in the environment variable PROTEAN_API_KEY: an operator's key
(the host then answers for the key's tenants only) or an admin's. The key is
never a flag: a command line is visible to every user in ps and kept in the
shell's history. The host records each action under the key's id. Without
--url the command opens the config's stores, sees every tenant, and records
each action in the audit log (protean-host audit) as "cli:" and the user.
`

// Environment variables of the remote mode.
const (
	envURL    = "PROTEAN_URL"
	envAPIKey = "PROTEAN_API_KEY"
)

// remoteTimeout bounds one call to a host.
const remoteTimeout = 30 * time.Second

// operator is where an operator command's operations are: a host's HTTP
// API (url set) or the config's stores.
type operator struct{ url, output string }

// bind adds --url and -o to fs.
func (o *operator) bind(fs *flag.FlagSet) {
	fs.StringVar(&o.url, "url", os.Getenv(envURL), "ask the running host at `URL` (default $"+envURL+"), with the API key in $"+envAPIKey)
	fs.StringVar(&o.output, "o", "text", "output `FORMAT`: text (tables) or json (what the host's /v1/ops API answers)")
}

// show prints v, what the command read or did: as JSON with -o json,
// else as text.
func (o *operator) show(e *env, v any, text func(io.Writer) error) error {
	if o.output == "json" {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return text(e.stdout)
}

// parse parses the rest of the flags, and the config unless the command
// asks a host.
func (o *operator) parse(e *env, fs *flag.FlagSet, args []string) error {
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments: %v", fs.Args())
	}
	if o.output != "text" && o.output != "json" {
		return usagef("-o %q: the output is text or json", o.output)
	}
	if o.url != "" {
		return nil
	}
	return e.configure(e.configPath)
}

// open returns the operations and the scope to ask them in: a Client of
// the host at --url, or the Service direct opens, in the All scope.
func (o *operator) open(ctx context.Context, direct func(ctx context.Context) (*local.Service, func(), error)) (ops.API, ops.Scope, func(), error) {
	if o.url != "" {
		c, err := ops.NewClient(o.url, os.Getenv(envAPIKey), remoteTimeout)
		if err != nil {
			return nil, ops.Scope{}, nil, fmt.Errorf("--url: %w", err)
		}
		return c, ops.All(), func() {}, nil
	}
	s, closeAll, err := direct(ctx)
	if err != nil {
		return nil, ops.Scope{}, nil, err
	}
	return s, ops.All(), closeAll, nil
}

// cliActor names the local user in the audit log of a direct action.
func cliActor(user string) string {
	return "cli:" + cmp.Or(user, os.Getenv("USER"), "unknown")
}

// noTenancy places nothing in a tenant: a command that loads no plugins
// acts in the All scope, and its audit entries name no tenant.
func noTenancy() ops.Tenancy {
	return ops.Tenancy{Handlers: map[string]string{}, Owner: func(string) string { return "" }}
}

// databaseOps is the operations API over the config's migrated database:
// the event-store subscriptions (every one with a positions row, loaded
// or not), the outbox and the audit log.
func databaseOps(e *env) func(ctx context.Context) (*local.Service, func(), error) {
	return func(ctx context.Context) (*local.Service, func(), error) {
		pool, err := openMigratedPool(ctx, e.cfg)
		if err != nil {
			return nil, nil, err
		}
		positions := position.NewPostgres(pool, nil)
		s, err := local.New(local.Options{Tenancy: noTenancy,
			Stored: func(ctx context.Context) ([]subscription.Subscription, error) {
				rows, err := positions.List(ctx, "")
				if err != nil {
					return nil, err
				}
				isSub, err := subscriptionUnits(ctx, pool, rows)
				if err != nil {
					return nil, err
				}
				var out []subscription.Subscription
				for _, r := range rows {
					if isSub(r.Unit) { // else a Redis partition's row: protean-host partitions list
						out = append(out, subscription.Subscription{Group: r.Group, Category: r.Unit})
					}
				}
				return out, nil
			},
			Positions: positions, Leases: subscription.NewPostgresLeases(pool), Head: subscription.PostgresHead(pool),
			Failures: subscription.NewPostgresFailures(pool), Outbox: outbox.NewPostgres(pool, nil), Audit: audit.NewPostgres(pool)})
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return s, pool.Close, nil
	}
}

// printDone prints an action's outcome.
func printDone(w io.Writer, d ops.Done) {
	fmt.Fprintln(w, d.Detail)
	fmt.Fprintf(w, "audit entry %d: %s %s (tenant %s)\n", d.Audit, d.Action, d.Target, dash(d.Tenant))
}

// printAudit prints audit entries as a table.
func printAudit(w io.Writer, es []audit.Entry) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tAT\tPRINCIPAL\tTENANT\tACTION\tTARGET\tOUTCOME\tREASON")
	for _, a := range es {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.At.Format(time.RFC3339), a.Principal, dash(a.Tenant), a.Action, a.Target,
			a.Outcome, dash(a.Reason))
	}
	return tw.Flush()
}

const auditUsage = `usage: protean-host audit [--limit N] [--before ID] [--url URL]

The audit log: every operator's action (partitions, subscriptions, outbox,
over the HTTP API or by this CLI), newest first, with who asked, the
tenant, the action, the target and the outcome. --before ID pages back
from an entry's ID. It lives in the database: a config without one has
none to show (ask the running host with --url).
` + remoteHelp

func cmdAudit(ctx context.Context, e *env, args []string) error {
	fs := e.configFlags("audit")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), auditUsage, "\nflags:\n")
		fs.PrintDefaults()
	}
	var o operator
	o.bind(fs)
	limit := fs.Int("limit", audit.DefaultLimit, fmt.Sprintf("at most `N` entries (at most %d)", audit.MaxLimit))
	before := fs.Int64("before", 0, "only the entries older than entry `ID`")
	if err := o.parse(e, fs, args); err != nil {
		return err
	}
	if *limit <= 0 || *limit > audit.MaxLimit {
		return fmt.Errorf("--limit must be between 1 and %d", audit.MaxLimit)
	}
	if *before < 0 {
		return fmt.Errorf("--before must be an audit entry's ID > 0")
	}
	api, sc, closeAll, err := o.open(ctx, databaseOps(e))
	if err != nil {
		return err
	}
	defer closeAll()
	es, err := api.Audit(ctx, sc, audit.Query{Before: *before, Limit: *limit})
	if err != nil {
		return err
	}
	if err := o.show(e, es, func(w io.Writer) error { return printAudit(w, es) }); err != nil {
		return err
	}
	if o.output == "json" {
		return nil
	}
	if len(es) == *limit {
		fmt.Fprintf(e.stdout, "older entries: protean-host audit --before %d\n", es[len(es)-1].ID)
	}
	return nil
}
