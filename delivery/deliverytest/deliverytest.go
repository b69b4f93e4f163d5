package deliverytest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// Features states what a source promises beyond the baseline every source
// meets (delivery once in publish order, retries, infrastructure failures
// retried uncharged, a clean stop and resume). Halt, Park and DeadLetter
// say how a message past its retries is given up; at most one is set, and
// with none the poison tests are skipped.
type Features struct {
	// Keyed: messages carry partition keys; per-key publish order is kept,
	// keys are independent, and a halt stops one key only. Without it the
	// suite publishes every message without a key, to one stream, and
	// expects that stream's publish order.
	Keyed bool
	// Halt: a message's own failure past MaxRetries halts its unit (its
	// key, or the stream when unkeyed): the unit's later messages are not
	// delivered.
	Halt bool
	// Park: the message is recorded (a failure record) and its unit goes
	// on past it.
	Park bool
	// DeadLetter: the message is dead-lettered and its unit goes on past
	// it.
	DeadLetter bool
}

// Message is what the suite publishes.
type Message struct {
	// Key is the message's partition key ("" when the source is unkeyed).
	Key  string
	Type string
	// Data is a JSON object whose "key" field is Key (so a source that
	// reads the key from the data, by a sequential_by field "key", finds
	// it) and whose "name" field is the suite's name of the message.
	Data json.RawMessage
}

// Config is what the suite starts a source with.
type Config struct {
	// Handler is the suite's scripted handler. It commits through
	// Harness.Commit.
	Handler delivery.Handler
	// Policy is the retry policy (MaxRetries and millisecond delays): the
	// source must use it as it is.
	Policy delivery.Policy
	// Classify is the suite's classification of its handler's errors
	// ([Classify]): the source must use it.
	Classify func(error) delivery.Class
}

// Harness is one private, empty instance of a source and its stores. Its
// methods are called from the test goroutine, except Commit, which the
// handler calls from the source's goroutines.
type Harness interface {
	// Publish publishes msgs in order (one after the other, each visible
	// to the source before the next) and returns the IDs the source hands
	// them to the handler under (delivery.Message.ID), in order.
	Publish(ctx context.Context, msgs ...Message) ([]string, error)
	// Start runs the source, with c, over what was and will be published,
	// and returns the function that stops it (a two-phase stop: soft, then
	// hard at the context's end). The suite may Start again after a stop
	// (a restart, or the next owner): the new run must resume after what
	// committed. The suite calls each stop once.
	Start(ctx context.Context, c Config) (stop func(context.Context) error, err error)
	// Commit commits b.Messages[:n] (n >= 1): the unit's position after
	// them, fenced by b.Generation, in one transaction, as the source's
	// real handler commits effects. It returns what the stores return: an
	// error wrapping position.ErrApplied when the position already covers
	// them, position.ErrFenced when the unit has a newer owner.
	Commit(ctx context.Context, b delivery.Batch, n int) error
	// GivenUp returns the IDs of the messages the source gave up on their
	// own failure past their retries (the message that halted its unit,
	// the parked, the dead-lettered; not the messages held behind a
	// halt), read from the source's own storage, in any order.
	GivenUp(ctx context.Context) ([]string, error)
}

// NewHarness returns a new, empty Harness, not shared with any other
// call. Run calls it once per subtest, from parallel subtests.
type NewHarness func(t *testing.T) Harness

// OwnError is the suite's handler's failure of a message of its own:
// retryable unless Permanent.
type OwnError struct {
	Name      string
	Permanent bool
}

func (e *OwnError) Error() string {
	if e.Permanent {
		return fmt.Sprintf("deliverytest: message %s failed for good", e.Name)
	}
	return fmt.Sprintf("deliverytest: message %s failed", e.Name)
}

// errDown is the infrastructure failure the suite's handler plays (marked
// with delivery.MarkInfrastructure).
var errDown = errors.New("deliverytest: dial tcp 127.0.0.1:5432: connect: connection refused")

// Classify is the suite's classification: an [OwnError] is the message's
// own ([delivery.Retry], or [delivery.Permanent]); anything else, marked
// infrastructure or not (a commit's store error, a canceled context), is
// [delivery.Infrastructure].
func Classify(err error) delivery.Class {
	var oe *OwnError
	if delivery.IsInfrastructure(err) || !errors.As(err, &oe) {
		return delivery.Infrastructure
	}
	if oe.Permanent {
		return delivery.Permanent
	}
	return delivery.Retry
}

// policy is the suite's retry policy: 2 retries, millisecond pauses.
var policy = delivery.Policy{MaxRetries: 2, Delay: time.Millisecond, MaxDelay: 4 * time.Millisecond}

// Policy is the retry policy Config carries (a test that needs another
// changes only MaxRetries, and only for infrastructure failures, which it
// does not charge). A source whose retries of a message's own failure a
// broker keeps (the broker consumer groups) builds the broker with it.
func Policy() delivery.Policy { return policy }

// window is how long the suite gives a source that breaks a promise the
// chance to show it (a call after Stop). It is no bound on anything a
// source must do: one that keeps the promise passes whatever the load.
const window = 150 * time.Millisecond

// Run runs the suite.
func Run(t *testing.T, f Features, newHarness NewHarness) {
	n := 0
	for _, b := range []bool{f.Halt, f.Park, f.DeadLetter} {
		if b {
			n++
		}
	}
	require.LessOrEqual(t, n, 1, "Features: at most one of Halt, Park and DeadLetter")
	tests := []struct {
		name string
		fn   func(t *testing.T, e *env)
	}{
		{"DeliversOnceInOrder", testDeliversOnceInOrder},
		{"RetriesTheMessagesOwnFailure", testRetriesOwnFailure},
		{"PoisonIsGivenUp", testPoison},
		{"PermanentFailureIsGivenUpAtOnce", testPermanent},
		{"InfrastructureFailuresAreNotCharged", testInfrastructure},
		{"StopLetsTheCallInFlightCommitAndRestartResumes", testStop},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := &env{t: t, f: f, h: newHarness(t), byKey: map[string][]string{}}
			e.s = newScript(e)
			tt.fn(t, e)
			e.requireNoViolations()
		})
	}
}

// env is one subtest's view of the source under test. The suite names
// its messages ("a1", "b2"; "m3" when unkeyed) and finds a handed
// message's name in its data, so that a message delivered before Publish
// returned its ID is known; the IDs map the harness's given-up report to
// names.
type env struct {
	t *testing.T
	f Features
	h Harness
	s *script
	// byKey are the names published per key, in publish order; seq counts
	// the messages published per key.
	mu    sync.Mutex
	byKey map[string][]string
	seq   map[string]int
}

// keys are the keys a test publishes to: three when keyed, the one empty
// key (one stream) when not.
func (e *env) keys() []string {
	if e.f.Keyed {
		return []string{"a", "b", "c"}
	}
	return []string{""}
}

// need skips the test unless the source has all the features.
func (e *env) need(features ...bool) {
	e.t.Helper()
	for _, ok := range features {
		if !ok {
			e.t.Skip("the source does not claim a feature this test needs")
		}
	}
}

// publish publishes n messages to each key, interleaved (one per key,
// round after round), and returns their names per key.
func (e *env) publish(n int, keys ...string) map[string][]string {
	e.t.Helper()
	var msgs []Message
	var names []string
	out := map[string][]string{}
	e.mu.Lock()
	if e.seq == nil {
		e.seq = map[string]int{}
	}
	for range n {
		for _, k := range keys {
			e.seq[k]++
			name := fmt.Sprintf("%s%d", cmpOr(k, "m"), e.seq[k])
			data, _ := json.Marshal(map[string]string{"key": k, "name": name})
			msgs = append(msgs, Message{Key: k, Type: "Tested", Data: data})
			names = append(names, name)
			e.byKey[k] = append(e.byKey[k], name)
			out[k] = append(out[k], name)
		}
	}
	e.mu.Unlock()
	e.s.publishing(msgs, names)
	ids, err := e.h.Publish(testwait.Context(e.t), msgs...)
	require.NoError(e.t, err, "publish")
	require.Len(e.t, ids, len(msgs), "Publish returns one ID per message")
	e.s.published(ids, names)
	return out
}

// publishOne publishes one message to key and returns its name.
func (e *env) publishOne(key string) string {
	e.t.Helper()
	return e.publish(1, key)[key][0]
}

// published returns every name published, per key, in publish order.
func (e *env) published() map[string][]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string][]string{}
	for k, names := range e.byKey {
		out[k] = slices.Clone(names)
	}
	return out
}

// start starts the source with the suite's handler, policy and
// classification, and returns its stop, which is also called when the
// test ends unless the test called it.
func (e *env) start(p delivery.Policy) func() error {
	e.t.Helper()
	stop, err := e.h.Start(testwait.Context(e.t), Config{Handler: e.s, Policy: p, Classify: Classify})
	require.NoError(e.t, err, "start")
	var once sync.Once
	var serr error
	stopOnce := func() error {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), testwait.Limit())
			defer cancel()
			serr = stop(ctx)
		})
		return serr
	}
	e.t.Cleanup(func() { _ = stopOnce() })
	return stopOnce
}

// waitCommitted waits until every message in names committed.
func (e *env) waitCommitted(what string, names ...string) {
	e.t.Helper()
	testwait.For(e.t, what, func() (bool, string) {
		var missing []string
		for _, n := range names {
			if !e.s.isCommitted(n) {
				missing = append(missing, n)
			}
		}
		return len(missing) == 0, fmt.Sprintf("not committed: %v; committed: %v", missing, e.s.committedList())
	})
}

// waitAllCommitted waits until every published message committed, and
// fails at once if the source gives one up meanwhile.
func (e *env) waitAllCommitted() {
	e.t.Helper()
	var all []string
	for _, names := range e.published() {
		all = append(all, names...)
	}
	testwait.For(e.t, "every published message committed, none given up", func() (bool, string) {
		if given, err := e.givenUp(); err == nil && len(given) > 0 {
			require.FailNow(e.t, "the source gave messages up", "given up: %v; committed: %v", given, e.s.committedList())
		}
		var missing []string
		for _, n := range all {
			if !e.s.isCommitted(n) {
				missing = append(missing, n)
			}
		}
		return len(missing) == 0, fmt.Sprintf("not committed: %v; committed: %v", missing, e.s.committedList())
	})
}

// requireCommittedInOrder requires each key's committed messages to be
// want[key], in that order, each committed once, and nothing else to have
// committed.
func (e *env) requireCommittedInOrder(want map[string][]string) {
	e.t.Helper()
	got := e.s.committedByKey()
	for k, names := range want {
		require.Equal(e.t, names, got[k], "key %q: committed messages and their order", k)
	}
	for k, names := range got {
		if _, ok := want[k]; !ok {
			require.Empty(e.t, names, "key %q: nothing committed was expected", k)
		}
	}
}

// givenUp returns the names of the messages the source reports given up.
func (e *env) givenUp() ([]string, error) {
	ids, err := e.h.GivenUp(testwait.Context(e.t))
	if err != nil {
		return nil, err
	}
	return e.s.namesOf(ids), nil
}

// requireGivenUp requires the source to report exactly names as given up.
func (e *env) requireGivenUp(names ...string) {
	e.t.Helper()
	got, err := e.givenUp()
	require.NoError(e.t, err, "given up")
	require.ElementsMatch(e.t, names, got, "the messages the source gave up")
}

// waitGivenUp waits until the source reports name as given up.
func (e *env) waitGivenUp(name string) {
	e.t.Helper()
	testwait.For(e.t, fmt.Sprintf("message %s given up", name), func() (bool, string) {
		got, err := e.givenUp()
		if err != nil {
			return false, err.Error()
		}
		return slices.Contains(got, name), fmt.Sprintf("given up: %v; committed: %v", got, e.s.committedList())
	})
}

func (e *env) requireNoViolations() {
	e.t.Helper()
	require.Empty(e.t, e.s.violationList(), "the source broke a promise")
}

// script is the suite's delivery.Handler: it fails the messages it is told
// to, commits the rest through the harness, and records what it was handed
// and what committed. Messages are known by name.
type script struct {
	e  *env
	mu sync.Mutex
	// byName is every published message; idName maps the IDs Publish
	// returned to names.
	byName map[string]*pubMsg
	idName map[string]string
	// attempts counts, per message, the calls that reached it (a message
	// after a failing one in the same call is not reached).
	attempts map[string]int
	// committed are the messages that committed, in commit order.
	committed []string
	done      map[string]int
	// infra[name] failures with an infrastructure error are left; own[name]
	// failures of the message's own (-1: for ever), permanent says they
	// are permanent.
	infra     map[string]int
	own       map[string]int
	permanent map[string]bool
	// gate, if set, is called at the start of every call.
	gate func(ctx context.Context, b delivery.Batch)
	// calls counts Handle calls; closed says the source was stopped and
	// not started again, so no call may start.
	calls      int
	active     int
	closed     bool
	violations []string
}

type pubMsg struct {
	key, typ string
	// id is the ID Publish returned; seen the ID the message was handed
	// under first.
	id, seen string
}

func newScript(e *env) *script {
	return &script{e: e, byName: map[string]*pubMsg{}, idName: map[string]string{}, attempts: map[string]int{}, done: map[string]int{},
		infra: map[string]int{}, own: map[string]int{}, permanent: map[string]bool{}}
}

// publishing registers messages about to be published.
func (s *script) publishing(msgs []Message, names []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, n := range names {
		s.byName[n] = &pubMsg{key: msgs[i].Key, typ: msgs[i].Type}
	}
}

// published registers the IDs Publish returned.
func (s *script) published(ids, names []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, id := range ids {
		p := s.byName[names[i]]
		p.id = id
		s.idName[id] = names[i]
		if p.seen != "" && p.seen != id {
			s.violate("message %s published as %q, handed to the handler as %q", names[i], id, p.seen)
		}
	}
}

// failOwn makes the message fail on its own n times (-1: always).
func (s *script) failOwn(name string, n int, permanent bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.own[name], s.permanent[name] = n, permanent
}

// failInfra makes the message fail on the infrastructure n times.
func (s *script) failInfra(name string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.infra[name] = n
}

func (s *script) setGate(g func(ctx context.Context, b delivery.Batch)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gate = g
}

// setClosed says whether the source is stopped (no call may start).
func (s *script) setClosed(closed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = closed
}

func (s *script) violate(format string, args ...any) {
	s.violations = append(s.violations, fmt.Sprintf(format, args...))
}

// nameOf returns the suite's name of a handed message, or "" (a
// violation recorded) when it is none of the suite's. Under s.mu.
func (s *script) nameOf(m delivery.Message) string {
	var d struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(m.Data, &d)
	p, ok := s.byName[d.Name]
	switch {
	case !ok:
		s.violate("handed message %q (data %s), which the suite did not publish", m.ID, m.Data)
		return ""
	case p.id != "" && m.ID != p.id:
		s.violate("message %s handed as %q, published as %q", d.Name, m.ID, p.id)
	case m.Type != p.typ:
		s.violate("message %s handed with type %q, published %q", d.Name, m.Type, p.typ)
	case s.e.f.Keyed && m.PartitionKey != p.key:
		s.violate("message %s handed with partition key %q, published %q", d.Name, m.PartitionKey, p.key)
	}
	if p.seen == "" {
		p.seen = m.ID
	}
	return d.Name
}

// Handle fails the first message of b it is told to fail, commits the
// ones before it through the harness, and records them once committed.
func (s *script) Handle(ctx context.Context, b delivery.Batch) (int, error) {
	s.mu.Lock()
	s.calls++
	s.active++
	defer func() {
		s.mu.Lock()
		s.active--
		s.mu.Unlock()
	}()
	if s.closed {
		s.violate("a Handle call started after Stop returned (unit %s, %d messages)", b.Unit, len(b.Messages))
	}
	if len(b.Messages) == 0 {
		s.violate("a Handle call with no messages (unit %s)", b.Unit)
	}
	gate := s.gate
	s.mu.Unlock()
	if gate != nil {
		gate(ctx, b)
	}
	n, ferr := len(b.Messages), error(nil)
	names := make([]string, 0, len(b.Messages))
	s.mu.Lock()
	for i, m := range b.Messages {
		name := s.nameOf(m)
		names = append(names, name)
		s.attempts[name]++
		if s.infra[name] > 0 {
			s.infra[name]--
			n, ferr = i, delivery.MarkInfrastructure(fmt.Errorf("message %s: %w", name, errDown))
			break
		}
		if left := s.own[name]; left != 0 {
			if left > 0 {
				s.own[name]--
			}
			n, ferr = i, &OwnError{Name: name, Permanent: s.permanent[name]}
			break
		}
	}
	s.mu.Unlock()
	if n == 0 {
		return 0, ferr
	}
	if err := s.e.h.Commit(ctx, b, n); err != nil {
		return 0, err
	}
	s.mu.Lock()
	for _, name := range names[:n] {
		s.committed = append(s.committed, name)
		s.done[name]++
	}
	s.mu.Unlock()
	return n, ferr
}

// nameOfHanded is the name of a message the handler was handed.
func (s *script) nameOfHanded(m delivery.Message) string {
	var d struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(m.Data, &d)
	return d.Name
}

func (s *script) isCommitted(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.done[name] > 0
}

func (s *script) attemptsOf(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attempts[name]
}

// activeCount is the number of Handle calls in flight.
func (s *script) activeCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active
}

func (s *script) callCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// committedByKey returns the committed messages per key, in commit order.
func (s *script) committedByKey() map[string][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]string{}
	for _, n := range s.committed {
		k := s.byName[n].key
		out[k] = append(out[k], n)
	}
	return out
}

func (s *script) committedList() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.committed)
}

// namesOf maps IDs Publish returned to names ("?id" for an unknown one).
func (s *script) namesOf(ids []string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, len(ids))
	for i, id := range ids {
		if n, ok := s.idName[id]; ok {
			out[i] = n
		} else {
			out[i] = "?" + id
		}
	}
	return out
}

func (s *script) violationList() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := slices.Clone(s.violations)
	sort.Strings(out)
	return out
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
