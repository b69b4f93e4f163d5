// Command protean-host runs event-driven handlers compiled to WebAssembly.
//
//	protean-host run      [--config FILE] [--plugins DIR] [--listen ADDR] [--watch]
//	protean-host validate [--config FILE] [--plugins DIR]
//	protean-host migrate  [--config FILE]
//	protean-host outbox status | outbox retry ID [--config FILE]
//	protean-host plugin new NAME --kind KIND --category C [--dir DIR]
//	protean-host plugin test MODULE.wasm... --messages FILE.jsonl [--json]
//	protean-host plugin embed-manifest MODULE.wasm...
//	protean-host subscriptions list | failed | retry|skip GROUP UNIT POSITION [--config FILE]
//	protean-host keys new TENANT --role ROLE
//	protean-host dead-letters list | replay STREAM GROUP ID [--url URL]
//	protean-host audit [--limit N] [--before ID] [--url URL]
//	protean-host version
//
// The operator commands (partitions, subscriptions, outbox, dead-letters,
// audit) take --url URL (or $PROTEAN_URL) to ask a running host's HTTP
// API, with the key in $PROTEAN_API_KEY, instead of the stores.
//
// Every subcommand takes --config (default configs/domain.toml) and
// --plugins (overrides [plugins] dir). run, validate and the plugin tools,
// given no --config where configs/domain.toml does not exist (a handler's
// own directory), run the embedded default: memory stores, inline broker.
// Exit status 0 is success; failures print one line per problem.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/redisstream"
)

const defaultConfig = "configs/domain.toml"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *env, args []string) error
}

func commands() []command {
	return []command{
		{"run", "start the host: load plugins, serve the HTTP API, deliver events", cmdRun},
		{"validate", "load and validate the plugins against the config, print what they declare", cmdValidate},
		{"migrate", "create or upgrade the PostgreSQL schema (idempotent)", cmdMigrate},
		{"outbox", "status: rows by status, oldest pending, abandoned rows; retry ID: requeue a failed or abandoned row", cmdOutbox},
		{"plugin", "new NAME --kind K --category C: scaffold a handler module; test MODULE.wasm --messages FILE.jsonl: run it on in-memory stores; embed-manifest MODULE.wasm...: write its manifest into it for fast starts", cmdPlugin},
		{"partitions", "list | inspect CATEGORY KEY | skip | dlq | resume CATEGORY KEY: see and unblock halted partitions (Redis)", cmdPartitions},
		{"subscriptions", "list | failed | retry|skip GROUP UNIT POSITION: event-store subscriptions' positions, leases and failed messages (PostgreSQL)", cmdSubscriptions},
		{"dead-letters", "list | replay STREAM GROUP ID: the messages the consumer groups gave up on, and the partitions' moved aside; replay one", cmdDeadLetters},
		{"audit", "[--limit N] [--before ID]: the audit log of the operators' actions, newest first", cmdAudit},
		{"keys", "new TENANT --role ROLE: print a new API key once, with the [[http.auth.keys]] lines to add", cmdKeys},
		{"version", "print the build: module version or devel, commit, Go version", cmdVersion},
	}
}

// env is what every subcommand gets: its output streams and its flags.
type env struct {
	stdout, stderr io.Writer
	// help: the command line asks for help (-h, --help, help COMMAND):
	// what the command prints goes to stdout (stderr is stdout), and its
	// flag sets print their defaults there.
	help       bool
	configPath string
	pluginsDir string
	cfg        config.Config
	log        *slog.Logger
	// embedded: no config file was given and the default one does not
	// exist, so the defaults apply (configureOrDefault).
	embedded bool
}

// exitError carries a status without printing more than was printed.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// usageError is a command line the command cannot run (an unknown
// subcommand or flag, a missing or extra argument, a malformed one): exit
// status 2, and one line naming it with a pointer to the command's help.
// Other failures exit 1.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usagef is a usageError.
func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// wantsHelp reports whether args ask for help: -h, -help or --help
// before a "--".
func wantsHelp(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}

// run runs the command line args. Help (protean-host --help, help,
// help COMMAND, COMMAND [SUBCOMMAND] --help) goes to stdout with status
// 0; a usage error is one line on stderr with status 2; a failure, 1.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0:
		usage(stderr)
		return 2
	case args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || (args[0] == "help" && len(args) == 1):
		usage(stdout)
		return 0
	case args[0] == "help":
		args = []string{args[1], "--help"}
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		e := &env{stdout: stdout, stderr: stderr, help: wantsHelp(args[1:])}
		if e.help {
			e.stderr = stdout
		}
		err := c.run(ctx, e, args[1:])
		var ee exitError
		var ue usageError
		switch {
		case err == nil:
			return 0
		case errors.As(err, &ee):
			return ee.code
		case errors.Is(err, flag.ErrHelp):
			return 0
		case e.help:
			// Asked for help, it failed on the way: say so, as help.
			fmt.Fprintf(stdout, "protean-host %s: %v\n", c.name, err)
			return 0
		case errors.As(err, &ue):
			fmt.Fprintf(stderr, "protean-host %s: %v\n(protean-host %s --help tells how to use it)\n", c.name, err, c.name)
			return 2
		}
		fmt.Fprintf(stderr, "protean-host %s: %v\n", c.name, err)
		return 1
	}
	fmt.Fprintf(stderr, "protean-host: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: protean-host COMMAND [--config FILE] [--plugins DIR] [flags]")
	fmt.Fprintln(w, "commands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
}

// flags returns a FlagSet with the common flags bound to e: --config,
// and --plugins for a command that loads the plugins.
func (e *env) flags(name string) *flag.FlagSet {
	fs := e.configFlags(name)
	fs.StringVar(&e.pluginsDir, "plugins", "", "plugins `DIR` (overrides [plugins] dir)")
	return fs
}

// configFlags returns a FlagSet with --config bound to e. It prints its
// defaults on stdout when asked for help, and nothing on a bad flag: the
// error is the one line run prints (parseFlags).
func (e *env) configFlags(name string) *flag.FlagSet {
	fs := e.flagSet(name)
	fs.StringVar(&e.configPath, "config", defaultConfig, "configuration `FILE`")
	return fs
}

// flagSet is an empty FlagSet of the command name, printing as
// configFlags says.
func (e *env) flagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("protean-host "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if e.help {
		fs.SetOutput(e.stdout)
	}
	return fs
}

// parseFlags parses args with fs: a bad flag is a usageError.
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		return usageError{err}
	}
	return err
}

// parse parses args and loads the config, applying --plugins.
func (e *env) parse(fs *flag.FlagSet, args []string) error {
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments: %v", fs.Args())
	}
	return e.configure(e.configPath)
}

// parseOrDefault parses args as parse does, but without an explicit
// --config and without configs/domain.toml (run or validate from a
// handler's own directory) it runs the embedded default: see
// configureOrDefault.
func (e *env) parseOrDefault(fs *flag.FlagSet, args []string) error {
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected arguments: %v", fs.Args())
	}
	return e.configureOrDefault(fs)
}

// configureOrDefault loads the config of the parsed flags fs. When --config
// was not given and the default file does not exist, it loads no file: the
// embedded default (memory stores, inline broker, the plugins directory
// from --plugins), and e.embedded says so for the first log line. An
// explicit --config that does not exist is still an error.
func (e *env) configureOrDefault(fs *flag.FlagSet) error {
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "config" })
	if !explicit {
		if _, err := os.Stat(e.configPath); errors.Is(err, os.ErrNotExist) {
			e.configPath, e.embedded = "", true
		}
	}
	return e.configure(e.configPath)
}

// configure loads the config at path ("" for the defaults), applies
// --plugins, and sets up the log.
func (e *env) configure(path string) error {
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	if e.pluginsDir != "" {
		cfg.Plugins.Dir = e.pluginsDir
	}
	e.cfg = cfg
	if e.log == nil {
		e.log = slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return nil
}

// loader builds the module loader the config describes; serving is a
// host's (it starts serving before it compiles: host.LoaderOptions.
// CompileLater), not a command's that validates or inspects the modules.
func (e *env) loader(funcs host.Session, serving bool) (*host.Loader, error) {
	cfg := e.cfg
	limits := func(module string) host.Limits {
		l := cfg.ModuleLimits(module)
		return host.Limits{MemoryMB: l.MemoryMB, Timeout: l.Timeout(), ManifestTimeout: l.ManifestTimeout(),
			MaxOutputBytes: int(l.MaxOutputBytes), Uninterruptible: !l.Interruptible,
			MaxTableElements: l.MaxTableElements, MaxModuleBytes: int(l.MaxModuleBytes), CompileTimeout: l.CompileTimeout(),
			RecycleAboveMB: l.RecycleAboveMB, LogsPerSecond: l.LogLinesPerSecond, LogBurst: l.LogBurst,
			Instances: l.MaxInstances, InstanceIdle: instanceIdle(l), CodeIdle: l.CodeIdle(), MaxFunctions: l.MaxFunctions, MaxFunctionBytes: l.MaxFunctionBytes,
			MaxFunctionLocals: l.MaxFunctionLocals, MaxModuleLocals: l.MaxModuleLocals,
			MaxNestingDepth: l.MaxNestingDepth, MaxNestingCost: l.MaxNestingCost,
			MaxHostCalls: l.MaxHostCalls, MaxHostBytes: l.MaxHostBytes, MaxReadBytes: l.MaxReadBytes}
	}
	return host.NewLoader(host.LoaderOptions{
		Limits:           limits(""),
		TenantLimits:     limits,
		Tenancy:          cfg.Tenancy(),
		CacheDir:         cfg.Plugins.CacheDir,
		CacheMaxBytes:    int64(cfg.Plugins.CacheMaxMB) << 20,
		HostFunctions:    host.HostFunctions(funcs),
		RefuseLinks:      !cfg.Plugins.FollowLinks,
		RefuseWritable:   cfg.Plugins.RefuseWritable,
		GuestConcurrency: cfg.GuestSlots(),
		Shares:           cfg.Shares(),
		CompileLater:     serving,
		Logger:           e.log,
	})
}

// instanceIdle is instance_idle_ms for host.Limits, where 0 would take
// the default: the config's 0, keep idle instances, is negative there.
func instanceIdle(l config.Limits) time.Duration {
	if l.InstanceIdleMS == 0 {
		return -1
	}
	return l.InstanceIdle()
}

// checkConfigFile checks the config file as the loader checks the plugins
// directory (host.CheckWritable): whoever may write it decides what the
// host loads and where it connects. It is read once, at start, so it is
// checked then. (Under refuse_writable a writer could also turn the
// setting off: the refusal guards against a mistake, not an attacker who
// already writes the file.)
func (e *env) checkConfigFile() error {
	if e.configPath == "" {
		return nil
	}
	if err := host.CheckWritable(e.log, e.configPath, e.cfg.Plugins.RefuseWritable); err != nil {
		return fmt.Errorf("config %w", err)
	}
	return nil
}

func (e *env) broker() host.Broker {
	name := e.cfg.Outbox.Broker
	b := e.cfg.OutboxBroker()
	return host.Broker{Name: name, Provider: b.Provider, Capabilities: capabilities(b.Provider)}
}

// capabilities asks the provider's implementation what it guarantees, as
// the relay does of the opened broker, so validation and routing decide
// partitioning alike. Neither constructor does I/O, so `validate` still
// runs without connecting. An unknown provider guarantees nothing.
func capabilities(provider string) broker.Capability {
	opts := broker.DefaultOptions()
	switch provider {
	case config.ProviderInline:
		b, err := broker.NewInline(opts)
		if err != nil {
			return 0
		}
		defer func() { _ = b.Close() }()
		return b.Capabilities()
	case config.ProviderRedis:
		c := redis.NewClient(&redis.Options{})
		defer func() { _ = c.Close() }()
		b, err := redisstream.New(c, redisstream.Options{Options: opts})
		if err != nil {
			return 0
		}
		defer func() { _ = b.Close() }()
		return b.Capabilities()
	}
	return 0
}
