package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
)

// cmdPlugin is the handler author's tools: `plugin new` scaffolds a module,
// `plugin test` runs one against a file of messages, `plugin
// embed-manifest` writes a module's manifest into its file.
func cmdPlugin(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help" {
		fmt.Fprintln(e.stderr, "usage: protean-host plugin new NAME --kind KIND --category C [--dir DIR]")
		fmt.Fprintln(e.stderr, "       protean-host plugin test MODULE.wasm... --messages FILE.jsonl [--json]")
		fmt.Fprintln(e.stderr, "       protean-host plugin embed-manifest MODULE.wasm...")
		fmt.Fprintln(e.stderr, "(protean-host plugin SUBCOMMAND --help: its flags)")
		if len(args) == 0 {
			return exitError{2}
		}
		return flag.ErrHelp
	}
	switch args[0] {
	case "new":
		return cmdPluginNew(ctx, e, args[1:])
	case "test":
		return cmdPluginTest(ctx, e, args[1:])
	case "embed-manifest":
		return cmdPluginEmbedManifest(ctx, e, args[1:])
	}
	return usagef("unknown subcommand %q (want new, test or embed-manifest)", args[0])
}

// parseAuthor parses args for an author tool. Authors run these from their
// handler's directory, where the host's configs/domain.toml does not exist:
// there, as for run and validate, the embedded default applies (see
// configureOrDefault).
func (e *env) parseAuthor(fs *flag.FlagSet, args []string) error {
	if err := parseFlags(fs, interspersed(fs, args)); err != nil {
		return err
	}
	return e.configureOrDefault(fs)
}

// interspersed moves flags after positional arguments to the front, so
// `plugin test m.wasm --messages f.jsonl` parses as authors type it (the
// flag package stops at the first positional argument).
func interspersed(fs *flag.FlagSet, args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := a[1:]
		if name[0] == '-' {
			name = name[1:]
		}
		if strings.Contains(name, "=") {
			continue
		}
		if f := fs.Lookup(name); f != nil && !isBool(f) && i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	return append(flags, pos...)
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}
