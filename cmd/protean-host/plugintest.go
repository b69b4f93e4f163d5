package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/engine"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/routes"
	"github.com/proteanhq/protean-host/internal/unitofwork"
)

// A messages file line: a command or an event the modules under test get.
// Whether it is a command or an event is what the modules declare of its
// type. An event goes to a stream; a command has none.
type testMessage struct {
	Type     string          `json:"type"`
	Data     json.RawMessage `json:"data"`
	Stream   string          `json:"stream,omitempty"`
	Metadata *abi.Metadata   `json:"metadata,omitempty"`
	// Expect is the outcome the line must have (default "ok"): one of
	// outcomes.
	Expect string `json:"expect,omitempty"`
}

// Outcomes of a line or of one handler's message.
const (
	outcomeOK        = "ok"
	outcomeRejected  = "rejected"  // the handler said no (a command answers 422)
	outcomeConflict  = "conflict"  // an expected version did not match (409)
	outcomeInvalid   = "invalid"   // fields that do not match the declaration, a bad body, a rejected partition key (400/422)
	outcomeTransient = "transient" // a retry may help
	outcomePermanent = "permanent" // a bug, a scope violation, a trap
)

var outcomes = []string{outcomeOK, outcomeRejected, outcomeConflict, outcomeInvalid, outcomeTransient, outcomePermanent}

// lineReport is what one line did; `--json` prints it as is.
type lineReport struct {
	Line    int    `json:"line"`
	Type    string `json:"type"`
	Kind    string `json:"kind"` // command or event
	Stream  string `json:"stream,omitempty"`
	Outcome string `json:"outcome"`
	Expect  string `json:"expect"`
	Passed  bool   `json:"passed"`
	// Error is the line's first failure, or why it could not run.
	Error string `json:"error,omitempty"`
	// Handled lists every handler call the line caused, in order: the
	// command's handler, follow-up commands, and the deliveries of the
	// events they appended (and of the line's own event).
	Handled []handledReport `json:"handled"`
	// NotRun lists commands the handlers dispatched that no module under
	// test handles.
	NotRun []string `json:"not_run,omitempty"`
}

type handledReport struct {
	Handler  string           `json:"handler"`
	File     string           `json:"file"`
	Type     string           `json:"type"`
	Stream   string           `json:"stream,omitempty"`
	Position *int64           `json:"position,omitempty"`
	Outcome  string           `json:"outcome"`
	Error    string           `json:"error,omitempty"`
	Events   []abi.NewEvent   `json:"events,omitempty"`
	Writes   []abi.Write      `json:"writes,omitempty"`
	Commands []abi.NewCommand `json:"commands,omitempty"`
}

// maxDeliveries bounds the deliveries one line may cause: handlers that
// emit what they handle would otherwise never stop.
const maxDeliveries = 1000

// cmdPluginTest runs each line of a messages file through the modules under
// test and reports what every line did; it fails when a line's outcome is
// not the one it expects.
func cmdPluginTest(ctx context.Context, e *env, args []string) error {
	fs := e.flags("plugin test")
	messages := fs.String("messages", "", "JSONL `FILE` of messages, one per line (- for stdin)")
	asJSON := fs.Bool("json", false, "print one JSON report per line instead of text")
	if err := e.parseAuthor(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 || *messages == "" {
		return errors.New("usage: protean-host plugin test MODULE.wasm... --messages FILE.jsonl [--json]")
	}
	var in io.Reader = os.Stdin
	if *messages != "-" {
		f, err := os.Open(*messages)
		if err != nil {
			return exitErrorf(e, 2, "%v", err)
		}
		defer f.Close()
		in = f
	}
	// Guest logs and the engine's own: the engine's warnings about
	// follow-up commands that no module under test handles are reported
	// in the output instead.
	e.log = slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	l, err := e.loader(nil, false)
	if err != nil {
		return err
	}
	defer l.Close(context.WithoutCancel(ctx))
	set, err := loadUnderTest(ctx, e, l, fs.Args())
	if err != nil {
		return err
	}
	r := newTrial(set, slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	defer r.close()
	return runLines(ctx, e, r, in, *messages, *asJSON)
}

// loadUnderTest loads the modules at paths into one set. It prints every
// problem (a module that does not load, a clash between modules) and
// refuses with status 2 if there was any, closing what it loaded.
func loadUnderTest(ctx context.Context, e *env, l *host.Loader, paths []string) (*host.Set, error) {
	var mods []*host.Module
	var problems []error
	for _, p := range paths {
		m, err := l.LoadFile(ctx, p)
		if err != nil {
			problems = append(problems, err)
			continue
		}
		mods = append(mods, m)
	}
	set, setProblems := host.NewSet(mods, e.broker())
	for _, p := range setProblems {
		problems = append(problems, p)
	}
	if len(problems) > 0 {
		for _, m := range mods {
			_ = m.Close(ctx)
		}
		for _, p := range problems {
			fmt.Fprintln(e.stderr, p)
		}
		return nil, exitErrorf(e, 2, "%d problem(s) in the modules under test", len(problems))
	}
	return set, nil
}

// runLines runs every line of in (named name in errors) through r, skipping
// blank lines and # comments, and prints each line's report and, as text,
// the tally. A failed line makes it return status 1.
func runLines(ctx context.Context, e *env, r *trial, in io.Reader, name string, asJSON bool) error {
	passed, failed := 0, 0
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), 16<<20)
	n := 0
	for sc.Scan() {
		n++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		rep := r.line(ctx, n, line)
		if rep.Passed {
			passed++
		} else {
			failed++
		}
		if asJSON {
			b, _ := json.Marshal(rep)
			fmt.Fprintln(e.stdout, string(b))
		} else {
			printReport(e.stdout, rep)
		}
	}
	if err := sc.Err(); err != nil {
		return exitErrorf(e, 2, "%s: %v", name, err)
	}
	if !asJSON {
		fmt.Fprintf(e.stdout, "%d messages: %d passed, %d failed\n", passed+failed, passed, failed)
	}
	if failed > 0 {
		return exitError{1}
	}
	return nil
}

// exitErrorf prints a one-line reason and returns the status.
func exitErrorf(e *env, code int, format string, args ...any) error {
	fmt.Fprintf(e.stderr, "protean-host plugin test: "+format+"\n", args...)
	return exitError{code}
}

// trial runs messages through the engine on fresh memory stores, one at a
// time and synchronously: a command is dispatched as the HTTP API does; an
// event is appended to the store; then every event the store gained is
// handed to its subscribers through the engine's batch path (the one the
// partition workers use, one message per batch), until none is left. So a
// module runs the host's own code: scope checks, the unit of work with its
// expected versions and partition-key rules, follow-up commands.
type trial struct {
	set     *host.Set
	mem     *unitofwork.Memory
	eng     *engine.Engine
	current *lineReport
	cursor  int64 // the last global position delivered
	gens    map[string]int64
}

// unit is the consumer-positions unit of every delivery: the trial has one
// consumer per handler, and delivers each message once.
const trialUnit = "plugin-test"

func newTrial(set *host.Set, log *slog.Logger) *trial {
	r := &trial{set: set, mem: unitofwork.NewMemory(), gens: map[string]int64{}}
	uow := unitofwork.New(r.mem, unitofwork.Options{Keys: routes.Of(set, true), Broker: "default"})
	r.eng = engine.New(set, engine.Options{Events: r.mem.Events, Records: r.mem.Records, UnitOfWork: uow, Logger: log,
		Handled: r.handled})
	return r
}

func (r *trial) close() { _ = r.eng.Stop(context.Background()) }

// handled records a handler's call on the line being run (the engine calls
// it on the goroutine running the line).
func (r *trial) handled(h engine.Handled) {
	if r.current == nil {
		return
	}
	hr := handledReport{Handler: h.Handler, File: h.File, Type: h.Message.Type, Stream: h.Message.Stream, Outcome: outcomeOK}
	if h.Message.Stream != "" {
		p := h.Message.Position
		hr.Position = &p
	}
	if h.Err != nil {
		hr.Outcome, hr.Error = outcomeOf(h.Err), h.Err.Error()
	}
	if h.Effects != nil {
		hr.Events, hr.Writes, hr.Commands = h.Effects.Events, h.Effects.Writes, h.Effects.Commands
	}
	r.current.Handled = append(r.current.Handled, hr)
}

// outcomeOf classifies an error as the HTTP API and the consumers do.
func outcomeOf(err error) string {
	var he *engine.HandlerError
	var ke *unitofwork.KeyError
	var se *engine.ScopeError
	switch {
	case err == nil:
		return outcomeOK
	case unitofwork.Conflict(err):
		return outcomeConflict
	case errors.As(err, &ke), errors.Is(err, engine.ErrBadInput), errors.Is(err, abi.ErrInput):
		return outcomeInvalid
	case errors.As(err, &he):
		switch he.Kind {
		case abi.ErrorRejected:
			return outcomeRejected
		case abi.ErrorTransient:
			return outcomeTransient
		}
		return outcomePermanent
	case errors.As(err, &se):
		return outcomePermanent
	}
	return outcomePermanent
}

// line runs one line of the messages file.
func (r *trial) line(ctx context.Context, n int, b []byte) (rep lineReport) {
	rep = lineReport{Line: n, Outcome: outcomeOK, Expect: outcomeOK, Handled: []handledReport{}}
	defer func() {
		r.current = nil
		rep.Passed = rep.Outcome == rep.Expect
	}()
	// fail marks the line as not runnable: it fails whatever it expects.
	fail := func(format string, args ...any) lineReport {
		rep.Outcome, rep.Error = "error", fmt.Sprintf(format, args...)
		return rep
	}
	m, md, decl, err := r.parse(b, &rep)
	if err != nil {
		return fail("line %d: %v", n, err)
	}
	rep.Kind = string(decl.Kind)
	r.current = &rep
	var first error
	if err := r.start(ctx, m, md, decl, &first); err != nil {
		return fail("line %d: %v", n, err)
	}
	if err := r.deliver(ctx, &first); err != nil {
		return fail("line %d: %v", n, err)
	}
	r.settle(&rep, first)
	return rep
}

// parse decodes a line into its message, metadata and declaration, filling
// in rep's type, stream and expected outcome as it goes. An error says why
// the line cannot run.
func (r *trial) parse(b []byte, rep *lineReport) (m testMessage, md abi.Metadata, decl abi.Message, err error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, md, decl, fmt.Errorf("%v (want {\"type\":…,\"data\":{…}} with optional stream, metadata, expect)", err)
	}
	rep.Type, rep.Stream = m.Type, m.Stream
	if m.Expect != "" {
		rep.Expect = m.Expect
	}
	if !contains(outcomes, rep.Expect) {
		return m, md, decl, fmt.Errorf("expect %q: want one of %s", m.Expect, strings.Join(outcomes, ", "))
	}
	if len(m.Data) == 0 {
		m.Data = json.RawMessage(`{}`)
	}
	if m.Metadata != nil {
		md = *m.Metadata
	}
	decl, ok := r.set.Message(m.Type)
	if !ok {
		return m, md, decl, fmt.Errorf("type %q is not declared by the modules under test", m.Type)
	}
	return m, md, decl, nil
}

// start puts the line's message in: a command is dispatched (its failure
// goes to *first and onto its call), an event appended to its stream. An
// error says why the line cannot run.
func (r *trial) start(ctx context.Context, m testMessage, md abi.Metadata, decl abi.Message, first *error) error {
	switch decl.Kind {
	case abi.MessageCommand:
		if m.Stream != "" {
			return fmt.Errorf("command %s takes no stream", m.Type)
		}
		if _, ok := r.set.Command(m.Type); !ok {
			return fmt.Errorf("no module under test handles command %s", m.Type)
		}
		if _, err := r.eng.Dispatch(ctx, m.Type, m.Data, md); err != nil {
			*first = err
			r.attach(err)
		}
	default:
		cat, _, err := abi.SplitStream(m.Stream)
		if err != nil {
			return fmt.Errorf("event %s needs a stream \"%s-{id}\": %v", m.Type, decl.Category, err)
		}
		if cat != decl.Category {
			return fmt.Errorf("event %s is declared on category %s, not %s", m.Type, decl.Category, cat)
		}
		mdj, _ := json.Marshal(md)
		if _, err := r.mem.Events.Append(ctx, []eventstore.NewEvent{{Stream: m.Stream, Type: m.Type, Data: m.Data,
			Metadata: mdj, ExpectedVersion: eventstore.AnyVersion}}); err != nil {
			return fmt.Errorf("append %s to %s: %v", m.Type, m.Stream, err)
		}
	}
	return nil
}

// settle sets rep's outcome from the line's first failure, or else from
// the first failed call it caused, and lists the follow-up commands that
// no module under test handles.
func (r *trial) settle(rep *lineReport, first error) {
	if first != nil {
		rep.Outcome, rep.Error = outcomeOf(first), first.Error()
	}
	for _, h := range rep.Handled {
		// A follow-up command's failure is not returned to the line,
		// whose own work committed; it fails the line all the same.
		if h.Outcome != outcomeOK && first == nil {
			rep.Outcome, rep.Error = h.Outcome, h.Error
			first = errors.New(h.Error)
		}
		// Commands of a committed call that no module under test
		// handles were not run (the engine's attempt failed quietly).
		for _, c := range h.Commands {
			if _, ok := r.set.Command(c.Type); !ok && h.Outcome == outcomeOK {
				rep.NotRun = append(rep.NotRun, c.Type)
			}
		}
	}
}

// attach puts a commit's failure (a conflict, a rejected key) on the call
// it belongs to, the last one reported, unless that call failed itself.
func (r *trial) attach(err error) {
	hs := r.current.Handled
	if len(hs) > 0 && hs[len(hs)-1].Outcome == outcomeOK {
		hs[len(hs)-1].Outcome, hs[len(hs)-1].Error = outcomeOf(err), err.Error()
	}
}

// deliver hands every event the store gained since the last delivery to
// its subscribers, in global order, until no new event is left.
func (r *trial) deliver(ctx context.Context, first *error) error {
	count := 0
	for {
		evs, err := r.mem.Events.ReadAll(ctx, r.cursor+1, 100)
		if err != nil {
			return err
		}
		if len(evs) == 0 {
			return nil
		}
		for _, ev := range evs {
			r.cursor = ev.GlobalPosition
			for _, route := range r.set.Subscribers(ev.Type) {
				if count++; count > maxDeliveries {
					return fmt.Errorf("more than %d deliveries from one line: do handlers emit what they handle?", maxDeliveries)
				}
				if err := r.deliverOne(ctx, route, ev); err != nil && *first == nil {
					*first = err
				}
			}
		}
	}
}

func (r *trial) deliverOne(ctx context.Context, route host.Route, ev eventstore.Event) error {
	group := route.Handler.Name
	gen, ok := r.gens[group]
	if !ok {
		row, err := r.mem.Positions.Claim(ctx, group, trialUnit)
		if err != nil {
			return err
		}
		gen = row.Generation
		r.gens[group] = gen
	}
	cat := eventstore.Category(ev.Stream)
	msg := delivery.Message{ID: ev.ID, Stream: cat, Type: ev.Type, Data: ev.Data, Metadata: ev.Metadata,
		EventStream: ev.Stream, Category: cat, Position: ev.Position, GlobalPosition: ev.GlobalPosition, Time: ev.Time}
	before := len(r.current.Handled)
	_, err := r.eng.Handler().Handle(ctx, delivery.Batch{Group: group, Unit: trialUnit, Source: cat, Generation: gen,
		Messages: []delivery.Message{msg}})
	if err != nil && len(r.current.Handled) > before {
		r.attach(err)
	}
	return err
}

// printReport prints a line's report for a person: the outcome, then each
// handler call with its effects (payloads cut to keep lines readable).
func printReport(w io.Writer, rep lineReport) {
	head := fmt.Sprintf("%d %s", rep.Line, rep.Type)
	if rep.Kind != "" {
		head += " (" + rep.Kind
		if rep.Stream != "" {
			head += " on " + rep.Stream
		}
		head += ")"
	}
	switch {
	case rep.Passed && rep.Outcome == outcomeOK:
		fmt.Fprintf(w, "%s: ok\n", head)
	case rep.Passed:
		fmt.Fprintf(w, "%s: %s, as expected\n", head, rep.Outcome)
	default:
		fmt.Fprintf(w, "%s: FAIL: %s (expected %s)\n", head, rep.Outcome, rep.Expect)
		if rep.Error != "" {
			fmt.Fprintf(w, "    %s\n", cutText(rep.Error, 400))
		}
	}
	for _, h := range rep.Handled {
		where := ""
		if h.Position != nil {
			where = fmt.Sprintf(" %s@%d", h.Stream, *h.Position)
		}
		fmt.Fprintf(w, "    %s [%s] %s%s: %s\n", h.Handler, filepath.Base(h.File), h.Type, where, h.Outcome)
		if h.Error != "" {
			fmt.Fprintf(w, "        %s\n", cutText(h.Error, 400))
		}
		for _, ev := range h.Events {
			exp := ""
			if ev.ExpectedVersion != nil {
				exp = fmt.Sprintf(" (expects version %d)", *ev.ExpectedVersion)
			}
			fmt.Fprintf(w, "        event   %s %s%s %s\n", ev.Stream, ev.Type, exp, cutText(string(ev.Data), 200))
		}
		for _, wr := range h.Writes {
			fmt.Fprintf(w, "        write   %s %s/%s v%d→v%d %s\n", wr.Kind, wr.Type, wr.ID, wr.ExpectedVersion, wr.ExpectedVersion+1, cutText(string(wr.Data), 200))
		}
		for _, c := range h.Commands {
			fmt.Fprintf(w, "        command %s %s\n", c.Type, cutText(string(c.Data), 200))
		}
	}
	for _, t := range rep.NotRun {
		fmt.Fprintf(w, "    (command %s not run: no module under test handles it)\n", t)
	}
}

func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("… (%d bytes)", len(s))
}
