package unitofwork

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
	"github.com/proteanhq/protean-host/record"
)

// Keys says how stream categories are partitioned: the sequential_by field
// of a category, if it has one. host.Set implements it.
type Keys interface {
	PartitionField(category string) (field string, ok bool)
}

// Options configure a UnitOfWork.
type Options struct {
	// Keys gives each partitioned category's key field; nil means none.
	Keys Keys
	// BackfillSuffix is [server.priority_lanes] backfill_suffix, a reserved
	// key value.
	BackfillSuffix string
	// Broker is the outbox's target broker name, written on every row.
	Broker string
	// MaxRetries is the outbox rows' publish attempts before abandon.
	MaxRetries int
	// Committed, if set, is called after every successful commit (the
	// outbox relay uses it to wake up): once per transaction, so once for
	// a grouped commit of many commands.
	Committed func()
	// GroupCommit is the most steps (a command's Commit is one, a
	// CommitRun one per message) one transaction carries when callers
	// queue behind a commit of the same categories in flight (group
	// commit, on a backend that pipelines: PostgreSQL). 0 means
	// DefaultGroupCommit; 1 turns group commit off (each caller commits
	// alone).
	GroupCommit int
}

// UnitOfWork commits the effects of handled messages: record writes with
// optimistic concurrency, event appends with expected versions, and one
// outbox row per event, all in one transaction.
type UnitOfWork struct {
	backend Backend
	opts    Options
	group   *grouper // nil: each command commits alone
}

// New returns a UnitOfWork over backend.
func New(backend Backend, opts Options) *UnitOfWork {
	if opts.BackfillSuffix == "" {
		opts.BackfillSuffix = partition.DefaultBackfillSuffix
	}
	if opts.GroupCommit == 0 {
		opts.GroupCommit = DefaultGroupCommit
	}
	u := &UnitOfWork{backend: backend, opts: opts}
	if _, ok := backend.(pipeliner); ok && opts.GroupCommit > 1 {
		u.group = newGrouper(opts.GroupCommit)
	}
	return u
}

// Change is the effects of one handled message, and what its events carry.
type Change struct {
	Effects *abi.Effects
	// Metadata is written on every event (correlation and causation).
	Metadata abi.Metadata
	// Priority is the outbox priority of its events (higher first).
	Priority int
}

// Committed is what a commit wrote and what it left to do.
type Committed struct {
	Events []eventstore.Event
	// Commands are the commands the effects ask to dispatch, now that they
	// are committed.
	Commands []abi.NewCommand
}

// Conflict reports whether err is an expected-version conflict: a record
// or stream moved since the handler read it. Re-running the handler on
// fresh state may succeed.
func Conflict(err error) bool {
	return errors.Is(err, record.ErrExpectedVersion) || errors.Is(err, eventstore.ErrExpectedVersion)
}

// KeyError is an event whose partition key is missing or rejected by the
// key rules. Nothing of its unit of work is written.
type KeyError struct {
	Category string
	Type     string
	Field    string
	Err      error // a *partition.KeyError
}

func (e *KeyError) Error() string {
	return fmt.Sprintf("invalid sequential_by key on %s (field %s of %s): %v", e.Category, e.Field, e.Type, e.Err)
}

// Unwrap returns the *partition.KeyError.
func (e *KeyError) Unwrap() error { return e.Err }

// Commit writes the changes in one transaction: everything or nothing.
// Changes with nothing to write open no transaction. On PostgreSQL,
// commands that queue behind a commit of the same categories share one
// transaction (group commit: Options.GroupCommit), each with its own
// outcome: what it wrote, or its own error.
func (u *UnitOfWork) Commit(ctx context.Context, changes ...Change) (Committed, error) {
	return u.commit(ctx, nil, changes)
}

// CommitFenced writes the changes and applies fence in one transaction:
// the consumer's position moves with the effects of the messages it
// handled, or neither does. A fence that fails rolls the effects back:
// position.ErrFenced (a newer owner claimed the unit: stop, do not ack) or
// position.ErrApplied (the message was applied already: ack it). The
// transaction runs even when the changes write nothing, because a handler
// that wrote nothing has still handled its message.
func (u *UnitOfWork) CommitFenced(ctx context.Context, fence position.Fence, changes ...Change) (Committed, error) {
	return u.commit(ctx, &fence, changes)
}

// Step is one handled message of a run: its changes and, for a fenced
// consumer, the fence its commit applies (the unit's position after this
// message).
type Step struct {
	Fence   *position.Fence
	Changes []Change
}

// CommitRun commits a run of handled messages, each step atomically and in
// order, and returns what the steps that committed wrote (a prefix of
// steps) and the error of the first one that failed; the steps after it
// are not tried. This is group commit: on PostgreSQL the whole run is one
// transaction in one round trip; when a step fails, that transaction is
// rolled back and the steps are committed one at a time up to the failing
// one, whose typed error (a conflict, a fence, a key) is returned. Runs of
// other callers (other units') that queue behind a commit in flight share
// its next transaction (group commit, see the package doc). On memory
// each step is its own transaction.
func (u *UnitOfWork) CommitRun(ctx context.Context, steps []Step) ([]Committed, error) {
	staged := make([]*stage, 0, len(steps))
	var err error
	for _, st := range steps {
		s, serr := u.stage(st.Fence, st.Changes)
		if serr != nil {
			err = serr
			break
		}
		staged = append(staged, s)
	}
	alone := func(ctx context.Context) ([]Committed, error) { return u.commitRunAlone(ctx, staged) }
	var out []Committed
	var cerr error
	if u.group != nil && slices.ContainsFunc(staged, func(s *stage) bool { return !s.empty() }) {
		out, cerr = u.group.commit(ctx, u, staged, alone) // other units' runs share the transaction
	} else {
		out, cerr = alone(ctx)
	}
	if cerr != nil {
		return out, cerr
	}
	return out, err
}

// commitRunAlone commits a run's stages in one transaction (the pipeline,
// when the backend has one), or, when that fails and proves nothing
// committed, one at a time up to the first that fails: the prefix that
// committed, and that stage's error.
func (u *UnitOfWork) commitRunAlone(ctx context.Context, staged []*stage) ([]Committed, error) {
	if len(staged) > 1 {
		out, err := u.commitStages(ctx, staged)
		switch {
		case err == nil:
			return out, nil
		case errors.Is(err, ErrCommitUnknown):
			return nil, err // it may have committed: never twice
		}
	}
	out := make([]Committed, 0, len(staged))
	for _, s := range staged {
		c, err := u.commitOne(ctx, s)
		if err != nil {
			return out, err
		}
		out = append(out, c)
	}
	return out, nil
}

// stage is one step, checked and turned into the stores' terms.
type stage struct {
	fence      *position.Fence
	writes     []record.Write
	events     []eventstore.NewEvent
	keys       []*string
	priorities []int
	commands   []abi.NewCommand
	// key is a command's idempotency key (WithIdempotency); causation is
	// the command's id, the answer's.
	key       *keyWrite
	causation string
}

func (s *stage) empty() bool {
	return len(s.writes) == 0 && len(s.events) == 0 && s.fence == nil && s.key == nil
}

// stage checks changes (partition keys, metadata) and turns them into the
// stores' writes; nothing is sent anywhere.
func (u *UnitOfWork) stage(fence *position.Fence, changes []Change) (*stage, error) {
	s := &stage{fence: fence}
	for _, c := range changes {
		if c.Effects == nil {
			continue
		}
		for _, w := range c.Effects.Writes {
			s.writes = append(s.writes, record.Write{Key: record.Key{Kind: string(w.Kind), Type: w.Type, ID: w.ID}, ExpectedVersion: w.ExpectedVersion, Data: RecordData(w)})
		}
		if s.causation == "" {
			s.causation = c.Metadata.CausationID
		}
		md, err := json.Marshal(c.Metadata)
		if err != nil {
			return nil, err
		}
		for _, ev := range c.Effects.Events {
			key, err := u.key(ev)
			if err != nil {
				return nil, err
			}
			expected := eventstore.AnyVersion
			if ev.ExpectedVersion != nil {
				expected = *ev.ExpectedVersion
			}
			s.events = append(s.events, eventstore.NewEvent{ID: ev.ID, Stream: ev.Stream, Type: ev.Type, Data: ev.Data, Metadata: md, ExpectedVersion: expected})
			s.keys = append(s.keys, key)
			s.priorities = append(s.priorities, c.Priority)
		}
		s.commands = append(s.commands, c.Effects.Commands...)
	}
	sortWrites(s.writes)
	return s, nil
}

// rows are the outbox rows of a stage's appended events.
func (u *UnitOfWork) rows(s *stage, appended []eventstore.Event) ([]outbox.Row, error) {
	rows := make([]outbox.Row, len(appended))
	for i, ev := range appended {
		md, err := outboxMetadata(ev)
		if err != nil {
			return nil, err
		}
		rows[i] = outbox.Row{MessageID: ev.ID, Stream: ev.Stream, Category: eventstore.Category(ev.Stream), Type: ev.Type,
			Data: ev.Data, Metadata: md, PartitionKey: s.keys[i], Priority: s.priorities[i],
			TargetBroker: u.opts.Broker, MaxRetries: u.opts.MaxRetries}
	}
	return rows, nil
}

func (u *UnitOfWork) commit(ctx context.Context, fence *position.Fence, changes []Change) (Committed, error) {
	s, err := u.stage(fence, changes)
	if err != nil {
		return Committed{}, err
	}
	if fence == nil {
		s.key = keyFrom(ctx)
		if u.group != nil && !s.empty() {
			out, err := u.group.commit(ctx, u, []*stage{s}, func(ctx context.Context) ([]Committed, error) {
				c, err := u.commitOne(ctx, s)
				return []Committed{c}, err
			})
			if err != nil {
				return Committed{}, err
			}
			return out[0], nil
		}
	}
	return u.commitOne(ctx, s)
}

// commitOne commits one stage: pipelined when the backend can (one round
// trip), and step by step when it cannot or when the pipeline was refused
// (to learn the typed error, or in the rare case the work now succeeds).
func (u *UnitOfWork) commitOne(ctx context.Context, s *stage) (Committed, error) {
	if s.empty() {
		return Committed{Commands: s.commands}, nil
	}
	out, err := u.commitStages(ctx, []*stage{s})
	switch {
	case err == nil:
		return out[0], nil
	case errors.Is(err, ErrCommitUnknown):
		return Committed{}, err // it may have committed: never twice
	}
	return u.commitStepwise(ctx, s)
}

// commitStages commits stages in one pipelined transaction, if the backend
// pipelines; errPipeline otherwise. Any error means nothing was committed.
func (u *UnitOfWork) commitStages(ctx context.Context, stages []*stage) ([]Committed, error) {
	p, ok := u.backend.(pipeliner)
	if !ok {
		return nil, errNoPipeline
	}
	appended, err := p.commitPipelined(ctx, stages, u.opts.Broker, u.opts.MaxRetries)
	if err != nil {
		return nil, err
	}
	out := make([]Committed, len(stages))
	for i, s := range stages {
		out[i] = Committed{Events: appended[i], Commands: s.commands}
	}
	if u.opts.Committed != nil {
		u.opts.Committed()
	}
	return out, nil
}

// keyBatcher is a Tx that writes idempotency keys in its transaction.
type keyBatcher interface {
	writeKey(ctx context.Context, s *stage, events []eventstore.Event) error
}

var errNoPipeline = errors.New("unitofwork: the backend does not pipeline")

// ErrCommitUnknown means the connection failed after COMMIT was sent (its
// answer lost, or the context cancelled on the way): the unit of work may
// have committed or not. It is not run again, since a second commit would
// apply it twice; the error wraps the connection's.
var ErrCommitUnknown = errors.New("unitofwork: the commit's outcome is unknown")

// pipeliner is a backend that commits stages in one transaction in one
// round trip (two with an idempotency key), writing each appended event's
// outbox row for broker with maxRetries.
type pipeliner interface {
	commitPipelined(ctx context.Context, stages []*stage, broker string, maxRetries int) ([][]eventstore.Event, error)
}

func (u *UnitOfWork) commitStepwise(ctx context.Context, s *stage) (Committed, error) {
	out := Committed{Commands: s.commands}
	tx, err := u.backend.Begin(ctx)
	if err != nil {
		return Committed{}, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	// The fence goes first: a stale owner or a redelivery fails before
	// anything is staged, and on PostgreSQL the row lock is taken before
	// the category locks of the appends, in every fenced unit of work alike.
	if s.fence != nil {
		if err := tx.Advance(ctx, *s.fence); err != nil {
			return Committed{}, err
		}
	}
	if len(s.writes) > 0 {
		if err := tx.Write(ctx, s.writes); err != nil {
			return Committed{}, err
		}
	}
	if len(s.events) > 0 {
		appended, err := tx.Append(ctx, s.events)
		if err != nil {
			return Committed{}, err
		}
		rows, err := u.rows(s, appended)
		if err != nil {
			return Committed{}, err
		}
		if err := tx.Add(ctx, rows); err != nil {
			return Committed{}, err
		}
		out.Events = appended
	}
	if kb, ok := tx.(keyBatcher); ok && s.key != nil {
		if err := kb.writeKey(ctx, s, out.Events); err != nil {
			return Committed{}, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return Committed{}, err
	}
	if u.opts.Committed != nil {
		u.opts.Committed()
	}
	return out, nil
}

// key extracts and validates an event's partition key, if its category is
// partitioned. The rules run here, in the caller's transaction's scope, so
// a bad key fails the whole unit of work and never reaches the outbox.
func (u *UnitOfWork) key(ev abi.NewEvent) (*string, error) {
	if u.opts.Keys == nil {
		return nil, nil
	}
	category := eventstore.Category(ev.Stream)
	field, ok := u.opts.Keys.PartitionField(category)
	if !ok {
		return nil, nil
	}
	raw, err := partition.FieldValue(ev.Data, field)
	if err != nil {
		return nil, fmt.Errorf("event %s: data: %w", ev.Type, err)
	}
	key, err := partition.Validate(raw, u.opts.BackfillSuffix)
	if err != nil {
		return nil, &KeyError{Category: category, Type: ev.Type, Field: field, Err: err}
	}
	return &key, nil
}

// outboxMetadata is what a consumer needs beyond the payload to rebuild the
// envelope: the event's place in its stream and in the store. The event's
// metadata is the host's own encoding, so one that does not decode is a
// bug: it fails the unit of work rather than publish an event whose
// positions a consumer would read as zero.
func outboxMetadata(ev eventstore.Event) (json.RawMessage, error) {
	var md map[string]any
	if len(ev.Metadata) > 0 {
		if err := json.Unmarshal(ev.Metadata, &md); err != nil {
			return nil, fmt.Errorf("unitofwork: event %s of stream %s: metadata: %w", ev.ID, ev.Stream, err)
		}
	}
	if md == nil {
		md = map[string]any{}
	}
	md["position"] = ev.Position
	md["global_position"] = ev.GlobalPosition
	md["time"] = ev.Time
	b, err := json.Marshal(md)
	if err != nil {
		return nil, fmt.Errorf("unitofwork: event %s of stream %s: encode metadata: %w", ev.ID, ev.Stream, err)
	}
	return b, nil
}

// RecordData is the data w stores in its record: nil (the record's data
// deleted) for null, else w.Data as written.
func RecordData(w abi.Write) json.RawMessage {
	if isNull(w.Data) {
		return nil
	}
	return w.Data
}

func isNull(b json.RawMessage) bool {
	b = bytes.TrimSpace(b)
	return len(b) == 0 || bytes.Equal(b, []byte("null"))
}
