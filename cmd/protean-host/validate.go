package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
)

func cmdValidate(ctx context.Context, e *env, args []string) error {
	if err := e.parseOrDefault(e.flags("validate"), args); err != nil {
		return err
	}
	if err := e.checkConfigFile(); err != nil {
		return err
	}
	l, err := e.loader(nil, false)
	if err != nil {
		return err
	}
	defer l.Close(ctx)
	set, errs := host.LoadSet(ctx, l, e.cfg.Plugins.Dir, e.broker())
	if ctx.Err() != nil { // SIGINT or SIGTERM: what was not loaded is no problem of the files
		if set != nil {
			_ = set.Close(context.Background())
		}
		return fmt.Errorf("loading %s: %w", e.cfg.Plugins.Dir, context.Cause(ctx))
	}
	if len(errs) > 0 {
		for _, err := range errs {
			fmt.Fprintln(e.stderr, err)
		}
		fmt.Fprintf(e.stderr, "%d problem(s) in %s\n", len(errs), e.cfg.Plugins.Dir)
		return exitError{1}
	}
	defer set.Close(ctx)
	printSet(e, set)
	return nil
}

// printSet prints one row per handler: file, module version, handler,
// kind, categories and partition key.
func printSet(e *env, set *host.Set) {
	w := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "MODULE FILE\tVERSION\tHANDLER\tKIND\tCATEGORY\tPARTITION KEY")
	handlers := 0
	for _, m := range set.Modules() {
		for _, h := range m.Manifest.Handlers {
			handlers++
			cats, key := describeHandler(set, h)
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", m.File, m.Manifest.Module.Version, h.Name, h.Kind, cats, key)
		}
	}
	w.Flush()
	fmt.Fprintf(e.stdout, "%d modules, %d handlers: valid (broker %s, provider %s)\n",
		len(set.Modules()), handlers, e.broker().Name, e.broker().Provider)
}

// describeHandler is a handler's categories and partition keys as the
// status page shows them (host.Set.Partitioning), "-" for none.
func describeHandler(set *host.Set, h abi.Handler) (categories, key string) {
	p := set.Partitioning(h)
	categories, key = strings.Join(p.Categories, ", "), p.KeyText()
	if categories == "" {
		categories = "-"
	}
	if key == "" {
		key = "-"
	}
	return categories, key
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
