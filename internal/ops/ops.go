package ops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/host"
)

// API is what an operator may do; Service and Client implement it.
type API interface {
	// Partitions lists the partitions of the scope's handlers, and the
	// halted ones.
	Partitions(ctx context.Context, s Scope) ([]Partition, error)
	// Partition shows one partition, CATEGORY KEY, in each of the scope's
	// groups that read it (or in which it is halted).
	Partition(ctx context.Context, s Scope, category, key string) ([]PartitionDetail, error)
	// ActOnPartition skips, dead-letters or resumes (act.Action) the
	// halted partition CATEGORY KEY in group ("": the one group it is
	// halted in).
	ActOnPartition(ctx context.Context, s Scope, act Act, category, key, group string) (Done, error)
	// Subscriptions lists the event-store subscriptions of the running
	// set: position, head, lag, lease, open failures.
	Subscriptions(ctx context.Context, s Scope) ([]Subscription, error)
	// Failures lists the subscriptions' open failure records, and with
	// all the resolved and skipped ones too.
	Failures(ctx context.Context, s Scope, all bool) ([]Failure, error)
	// ActOnFailure retries or skips (act.Action) the failure record of
	// group at unit and global position pos.
	ActOnFailure(ctx context.Context, s Scope, act Act, group, unit string, pos int64) (Done, error)
	// Outbox shows the outbox: its counts (for the whole host's scope
	// only: they are not kept per tenant) and the scope's halted and
	// abandoned rows.
	Outbox(ctx context.Context, s Scope) (Outbox, error)
	// ActOnOutbox retries or skips (act.Action) outbox row id.
	ActOnOutbox(ctx context.Context, s Scope, act Act, id int64) (Done, error)
	// DeadLetters lists the scope's dead letters: the broker groups'
	// (replayable while the group runs) and, on Redis, the partitions'
	// that an operator moved to a DLQ stream (partitions dlq; not
	// replayable here). At most MaxDeadLetters of each stream, oldest
	// first.
	DeadLetters(ctx context.Context, s Scope) ([]DeadLetter, error)
	// ReplayDeadLetter (act.Action "replay") moves dead letter id (its
	// message id) of group on stream back to the head of the group's
	// line, with fresh attempts.
	ReplayDeadLetter(ctx context.Context, s Scope, act Act, stream, group, id string) (Done, error)
	// Audit lists the scope's audit entries, newest first.
	Audit(ctx context.Context, s Scope, q audit.Query) ([]audit.Entry, error)
}

// Scope is the tenants a caller may operate.
type Scope struct {
	all     bool
	tenants []string
}

// All is the scope of an admin and of the local CLI: every tenant, and
// the items of none.
func All() Scope { return Scope{all: true} }

// Tenants is the scope of the tenants ts.
func Tenants(ts ...string) Scope { return Scope{tenants: slices.Clone(ts)} }

// Has reports whether tenant is in s. The tenant "" (an item the running
// set does not place) is only in All.
func (s Scope) Has(tenant string) bool {
	return s.all || (tenant != "" && slices.Contains(s.tenants, tenant))
}

// IsAll reports whether s is All.
func (s Scope) IsAll() bool { return s.all }

// List is the scope as an audit query's tenants: nil for All.
func (s Scope) List() []string {
	if s.all {
		return nil
	}
	return append([]string{}, s.tenants...)
}

// Act is an action and who asks for it.
type Act struct {
	// Action is the verb: skip, dlq or resume for a partition; retry or
	// skip for a failure record or an outbox row; replay for a dead
	// letter.
	Action string `json:"action"`
	// By names who acts, for the audit log (a credential's name, or
	// "cli:" and the local user).
	By string `json:"-"`
	// Reason is the operator's explanation, kept in the audit log.
	Reason string `json:"reason,omitempty"`
}

// Done is an action's outcome.
type Done struct {
	// Tenant, Action and Target say what was done to what.
	Tenant string `json:"tenant"`
	Action string `json:"action"`
	Target string `json:"target"`
	// Detail says what came of it, in a sentence.
	Detail string `json:"detail"`
	// Audit is the audit entry's id.
	Audit int64 `json:"audit"`
}

// Errors of the actions; test with errors.Is.
var (
	// ErrForbidden: the target is outside the caller's scope, or does not
	// exist and the caller may not know that.
	ErrForbidden = errors.New("outside the caller's scope")
	// ErrNotFound: no such target (told only to a caller whose scope is
	// All).
	ErrNotFound = errors.New("no such target")
	// ErrConflict: the target's state does not allow the action (a
	// partition that is not halted, a record or row in the wrong status).
	ErrConflict = errors.New("the target's state does not allow this action")
	// ErrInvalid: a bad action or argument.
	ErrInvalid = errors.New("invalid operation")
)

// Partition is one partition in one consumer group.
type Partition struct {
	Tenant     string `json:"tenant"`
	Category   string `json:"category"`
	Key        string `json:"key"`
	Group      string `json:"group"`
	Owner      string `json:"owner,omitempty"`
	Generation int64  `json:"generation,omitempty"`
	Pending    int64  `json:"pending"`
	Lag        int64  `json:"lag"`
	// State is "halted", "owned" or "idle".
	State string `json:"state"`
	Halt  *Halt  `json:"halt,omitempty"`
}

// Halt is why and where a partition halted.
type Halt struct {
	Stream     string    `json:"stream"`
	Entry      string    `json:"entry"`
	MessageID  string    `json:"message_id,omitempty"`
	Attempts   int       `json:"attempts"`
	HaltedAt   time.Time `json:"halted_at"`
	Generation int64     `json:"generation"`
	Reason     string    `json:"reason"`
}

// PartitionDetail is one partition with its streams, positions and head
// entries.
type PartitionDetail struct {
	Partition
	Streams   []string         `json:"streams"`
	Positions map[string]int64 `json:"positions,omitempty"`
	Entries   []Entry          `json:"entries"`
}

// Entry is one entry at the head of a partition's stream.
type Entry struct {
	Stream string `json:"stream"`
	ID     string `json:"id"`
	// State is "halted", "pending" or "new".
	State          string `json:"state"`
	Deliveries     int64  `json:"deliveries"`
	Failures       int64  `json:"failures"`
	MessageID      string `json:"message_id,omitempty"`
	Type           string `json:"type,omitempty"`
	GlobalPosition int64  `json:"global_position,omitempty"`
	// Data is the message's data, cut; Problem why it cannot be shown.
	Data    string `json:"data,omitempty"`
	Problem string `json:"problem,omitempty"`
}

// Subscription is one event-store subscription of the running set.
type Subscription struct {
	Tenant     string `json:"tenant"`
	Group      string `json:"group"`
	Unit       string `json:"unit"`
	Position   int64  `json:"position"`
	Head       int64  `json:"head"`
	Lag        int64  `json:"lag"`
	Generation int64  `json:"generation"`
	Owner      string `json:"owner,omitempty"`
	// LeaseExpires is when the owner's lease ends; nil without one.
	LeaseExpires *time.Time `json:"lease_expires,omitempty"`
	OpenFailures int        `json:"open_failures"`
}

// Failure is one failure record of an event-store subscription.
type Failure struct {
	Tenant    string    `json:"tenant"`
	Group     string    `json:"group"`
	Unit      string    `json:"unit"`
	Position  int64     `json:"position"`
	Status    string    `json:"status"`
	Key       string    `json:"key,omitempty"`
	Type      string    `json:"type"`
	Stream    string    `json:"stream"`
	MessageID string    `json:"message_id"`
	Attempts  int       `json:"attempts"`
	Error     string    `json:"error"`
	FailedAt  time.Time `json:"failed_at"`
}

// Outbox is the outbox as an operator sees it.
type Outbox struct {
	// Counts are the rows by status, and OldestPending the creation time
	// of the oldest pending row: for the All scope only.
	Counts        map[string]int `json:"counts,omitempty"`
	OldestPending *time.Time     `json:"oldest_pending,omitempty"`
	// Rows are the scope's halted and abandoned rows.
	Rows []OutboxRow `json:"rows"`
	// RelayLeases say which host's relay claims each broker's rows: for
	// the All scope only.
	RelayLeases []RelayLease `json:"relay_leases,omitempty"`
}

// RelayLease is a broker's relay lease (outbox.RelayLeaser): Owner's relay
// claims the broker's rows until Expires unless it renews the lease; past
// it, the lease is free.
type RelayLease struct {
	Broker  string    `json:"broker"`
	Owner   string    `json:"owner"`
	Expires time.Time `json:"expires"`
}

// OutboxRow is a halted or abandoned outbox row.
type OutboxRow struct {
	Tenant    string    `json:"tenant"`
	ID        int64     `json:"id"`
	Status    string    `json:"status"`
	Category  string    `json:"category"`
	Key       string    `json:"key,omitempty"`
	MessageID string    `json:"message_id"`
	Broker    string    `json:"broker"`
	Retries   int       `json:"retries"`
	LastError string    `json:"last_error"`
	CreatedAt time.Time `json:"created_at"`
}

// MaxDeadLetters is how many dead letters of one stream a listing holds,
// the oldest: a DLQ can grow without bound, an answer cannot.
const MaxDeadLetters = 100

// DeadLetter is a message a consumer group gave up on, or a halted
// partition's head an operator moved aside.
type DeadLetter struct {
	Tenant string `json:"tenant"`
	Group  string `json:"group"`
	// Stream is the broker stream the group reads, or the partition's
	// stream ("{category}:{key}").
	Stream         string `json:"stream"`
	ID             string `json:"id"`
	Type           string `json:"type,omitempty"`
	GlobalPosition int64  `json:"global_position,omitempty"`
	// Reason is max_retries, timeout or rejected.
	Reason   string    `json:"reason"`
	Attempts int       `json:"attempts"`
	FailedAt time.Time `json:"failed_at"`
	// Source is "group" (the broker dead-lettered it) or "partition"
	// (an operator's partitions dlq).
	Source string `json:"source"`
	// Replayable: a running broker group's, so ReplayDeadLetter takes it.
	Replayable bool `json:"replayable"`
	// Data is the message's data, cut to 200 bytes.
	Data string `json:"data,omitempty"`
}

// Tenancy places a running set's items in their tenants.
type Tenancy struct {
	// Handlers maps each handler (a consumer group) to its module's
	// tenant.
	Handlers map[string]string
	// Owner returns the tenant that owns category ("" for none).
	Owner func(category string) string
}

// TenancyOf is the Tenancy of set.
func TenancyOf(set *host.Set) Tenancy {
	t := Tenancy{Handlers: map[string]string{}, Owner: func(c string) string {
		o, _ := set.Owners().Owner(c)
		return o
	}}
	for _, m := range set.Modules() {
		for _, h := range m.Manifest.Handlers {
			t.Handlers[h.Name] = m.Tenant
		}
	}
	return t
}

// CheckReplay refuses an action on a dead letter other than replay.
func CheckReplay(act Act) error {
	if act.Action != "replay" {
		return fmt.Errorf("%w: a dead letter's action is replay, not %q", ErrInvalid, act.Action)
	}
	return nil
}
