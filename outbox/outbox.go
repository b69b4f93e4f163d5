package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"
	"unicode/utf8"

	"github.com/proteanhq/protean-host/internal/jsonnul"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/txdone"
)

// Status is where a row is in its life.
type Status string

// Statuses.
const (
	// StatusPending rows wait for their first claim (or were requeued).
	StatusPending Status = "pending"
	// StatusProcessing rows are claimed by a relay until LockedUntil.
	StatusProcessing Status = "processing"
	// StatusPublished rows reached the broker.
	StatusPublished Status = "published"
	// StatusFailed rows failed to publish and wait for NextRetryAt.
	StatusFailed Status = "failed"
	// StatusAbandoned rows will not be published unless an operator
	// requeues them. They hold nothing back.
	StatusAbandoned Status = "abandoned"
	// StatusHalted rows have a partition key and failed to publish on
	// their own (not because the broker was down) past their max
	// retries: they still hold back the later rows of their key, so the
	// key's messages never reach their consumers out of order or past a
	// message that did not. An operator retries the row (Retry: pending
	// again, it goes first) or skips it (Abandon: the key flows on without
	// it).
	StatusHalted Status = "halted"
)

// statuses lists every status, in life order.
var statuses = [...]Status{StatusPending, StatusProcessing, StatusPublished, StatusFailed, StatusHalted, StatusAbandoned}

// Defaults.
const (
	// DefaultMaxRetries applies to a row added with MaxRetries 0.
	DefaultMaxRetries = 3
	// DefaultClaimLimit applies to a Claim with a limit <= 0.
	DefaultClaimLimit = 50
	// DefaultLockFor applies to a Claim with lockFor <= 0. It is how long
	// a relay that died holding claimed rows holds their keys back, so it
	// matches the default partition lease TTL: a host's death stalls
	// nothing longer than that. A pass holds its claim for milliseconds; a
	// pass slower than the lock lets another relay publish the same rows
	// again, which the Redis broker drops as duplicates (and partition
	// workers would skip by global position), so order holds.
	DefaultLockFor = 15 * time.Second
	// maxStatsAbandoned caps the abandoned rows Stats lists.
	maxStatsAbandoned = 100
	// MaxPartitionKeyLength and MaxBrokerLength are the widths, in
	// characters, of the partition_key and target_broker columns.
	MaxPartitionKeyLength = 255
	MaxBrokerLength       = 128
)

// Row is one message to publish to one broker.
type Row struct {
	// ID is assigned by the store; it grows with commit order.
	ID int64
	// MessageID identifies the message; with TargetBroker it is unique.
	MessageID string
	Stream    string
	// Category defaults to the stream's category.
	Category string
	Type     string
	Data     json.RawMessage
	Metadata json.RawMessage
	// PartitionKey is the message's sequential_by key, if any.
	PartitionKey *string
	// Priority orders claims: higher first.
	Priority int
	// TargetBroker names the broker the row is for. Required.
	TargetBroker string

	Status     Status
	RetryCount int
	// MaxRetries is how many failed publishes abandon the row; 0 on Add
	// means DefaultMaxRetries.
	MaxRetries  int
	NextRetryAt *time.Time
	LockedUntil *time.Time
	LockedBy    string
	// LastError is the last publish error or the abandon reason.
	LastError   string
	CreatedAt   time.Time
	PublishedAt *time.Time
	// Prev is set by ClaimChained only (Chainer), for a row with a
	// partition key: the global position of the newest published row of
	// its key before it that goes to the same stream, 0 if none is kept.
	Prev int64
}

// Stats summarises the outbox for operators and metrics.
type Stats struct {
	// Counts has an entry for every status.
	Counts map[Status]int
	// OldestPending is the creation time of the oldest pending row; nil
	// when none is pending.
	OldestPending *time.Time
	// Abandoned lists abandoned and halted rows, lowest ID first, at most
	// maxStatsAbandoned of them.
	Abandoned []Abandoned
	// RelayLeases are the brokers' relay leases as recorded (RelayLeaser),
	// by broker name, expired ones too: who claims each broker's rows.
	RelayLeases []RelayLease
}

// RelayLease is a broker's relay lease as Stats reports it: Owner holds it
// until Expires (a lease past it is free).
type RelayLease struct {
	Broker  string
	Owner   string
	Expires time.Time
}

// Abandoned is an abandoned or halted row as Stats reports it.
type Abandoned struct {
	ID     int64
	Status Status
	// Key is the row's partition key ("" for none): a halted row holds
	// back the later rows of its category's key.
	Category, Key string
	MessageID     string
	TargetBroker  string
	RetryCount    int
	LastError     string
	CreatedAt     time.Time
}

// Store is what a relay and the operator commands use. Rows are added
// through a transaction of the store's implementation.
type Store interface {
	// Claim leases up to limit claimable rows for broker to owner for
	// lockFor and returns them as claimed, highest priority first, then by
	// ID. A row is claimable when it is eligible and every earlier active
	// row of its ordering key is claimable too: a key's ready run goes out
	// in one claim, in order, and no two claims ever hold rows of one key
	// (see the package doc).
	Claim(ctx context.Context, broker, owner string, limit int, lockFor time.Duration) ([]Row, error)
	// MarkPublished records a publish by the row's lock owner.
	MarkPublished(ctx context.Context, id int64, owner string) error
	// MarkPublishedBatch records the publish of several rows by their lock
	// owner in one step. It marks every row owner holds and returns an
	// error wrapping ErrNotOwner, naming the others, if some were not held.
	MarkPublishedBatch(ctx context.Context, owner string, ids []int64) error
	// Release hands rows owner holds back unpublished: they are pending
	// again and no retry is counted. A relay releases the rest of a key's
	// run when a row before them failed, so they wait behind it.
	Release(ctx context.Context, owner string, ids []int64) error
	// MarkFailed records a publish that failed on the row's own account
	// (not the broker's: a relay releases rows the broker could not take)
	// by the row's lock owner: the row is retried at nextRetryAt, or, if
	// it has reached its max retries, halted (it has a partition key, and
	// keeps holding back its key) or abandoned.
	MarkFailed(ctx context.Context, id int64, owner, errMsg string, nextRetryAt time.Time) error
	// Abandon gives a row up, whoever holds it, with reason as its last
	// error; a halted row abandoned is skipped, and its key's later rows
	// go on. A published row cannot be abandoned.
	Abandon(ctx context.Context, id int64, reason string) error
	// Retry requeues a failed, halted or abandoned row as pending with no
	// retries used, keeping its last error for the record (the operator
	// command). An abandoned row with a partition key is refused with
	// ErrPassed once a later row of its key was published: retried, it
	// would reach the key's consumers after messages they have handled.
	Retry(ctx context.Context, id int64) error
	// Cleanup deletes published rows published before publishedBefore and
	// abandoned rows created before abandonedBefore, and returns how many
	// it deleted.
	Cleanup(ctx context.Context, publishedBefore, abandonedBefore time.Time) (int, error)
	// Stats summarises the rows.
	Stats(ctx context.Context) (Stats, error)
	// Get returns one row.
	Get(ctx context.Context, id int64) (Row, error)
}

// Errors for conditions.
var (
	// ErrDuplicate means a row with the same MessageID and TargetBroker
	// exists or was added twice.
	ErrDuplicate = errors.New("duplicate outbox row")
	// ErrNotOwner means the row is not processing under the caller's lock.
	ErrNotOwner = errors.New("outbox row not locked by this owner")
	// ErrNotFound means no row has the ID.
	ErrNotFound = errors.New("outbox row not found")
	// ErrStatus means the row's status does not allow the operation.
	ErrStatus = errors.New("outbox row status does not allow this")
	// ErrPassed means Retry of an abandoned row with a partition key whose
	// key has gone on past it: a later row of the key was published, so
	// its consumers are beyond it and would take it as already handled.
	ErrPassed = errors.New("later rows of the key were published past this row")
	// ErrInvalid is wrapped by errors about malformed input.
	ErrInvalid = errors.New("invalid outbox input")
	// ErrTxDone means a transaction was used after Commit or Rollback. It
	// is the one sentinel every store shares (errors.Is holds across them).
	ErrTxDone = txdone.Err
)

// prepare validates rows for Add and returns copies set up as new pending
// rows created at now. It does not check uniqueness.
func prepare(rows []Row, now time.Time) ([]Row, error) {
	out := make([]Row, len(rows))
	for i, r := range rows {
		if err := checkRow(i, r); err != nil {
			return nil, err
		}
		if r.Category == "" {
			r.Category = eventstore.Category(r.Stream)
		}
		if r.MaxRetries == 0 {
			r.MaxRetries = DefaultMaxRetries
		}
		r.ID = 0
		r.Status = StatusPending
		r.RetryCount = 0
		r.NextRetryAt, r.LockedUntil, r.PublishedAt = nil, nil, nil
		r.LockedBy, r.LastError = "", ""
		r.CreatedAt = now
		out[i] = copyRow(r)
	}
	return out, nil
}

// checkRow says what is wrong with row i, or nil. Its message is built
// only when something is.
func checkRow(i int, r Row) error {
	why := "empty message id"
	if r.MessageID != "" {
		why = checkTarget(r)
	}
	if why == "" {
		switch {
		case r.Stream == "":
			why = "empty stream"
		case r.Type == "":
			why = "empty type"
		case r.Data != nil && !json.Valid(r.Data):
			why = "data is not JSON"
		case r.Metadata != nil && !json.Valid(r.Metadata):
			why = "metadata is not JSON"
		case refusedText(r) != "":
			why = refusedText(r)
		case jsonnul.Refused(r.Data) != "":
			why = "data: " + jsonnul.Refused(r.Data)
		case jsonnul.Refused(r.Metadata) != "":
			why = "metadata: " + jsonnul.Refused(r.Metadata)
		}
	}
	if why == "" {
		return nil
	}
	return fmt.Errorf("row %d (message %s, broker %s): %w: %s", i, r.MessageID, r.TargetBroker, ErrInvalid, why)
}

// checkTarget is checkRow's part for what a row adds to its event (where
// it goes, its key, its retries), or "".
func checkTarget(r Row) string {
	switch {
	case r.TargetBroker == "":
		return "empty target broker"
	case utf8.RuneCountInString(r.TargetBroker) > MaxBrokerLength:
		return fmt.Sprintf("target broker longer than %d characters", MaxBrokerLength)
	case r.PartitionKey != nil && utf8.RuneCountInString(*r.PartitionKey) > MaxPartitionKeyLength:
		return fmt.Sprintf("partition key longer than %d characters", MaxPartitionKeyLength)
	case r.MaxRetries < 0:
		return fmt.Sprintf("max retries %d", r.MaxRetries)
	}
	return ""
}

// claimArgs checks a Claim's arguments and applies the defaults.
func claimArgs(ctx context.Context, broker, owner string, limit int, lockFor time.Duration) (int, time.Duration, error) {
	if err := ownerArgs(ctx, "claim", broker, owner); err != nil {
		return 0, 0, err
	}
	if limit <= 0 {
		limit = DefaultClaimLimit
	}
	if lockFor <= 0 {
		lockFor = DefaultLockFor
	}
	return limit, lockFor, nil
}

// ownerArgs checks the context and the broker and owner of op (a claim,
// a relay lease's hold or release).
func ownerArgs(ctx context.Context, op, broker, owner string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if broker == "" {
		return fmt.Errorf("%s: %w: empty broker", op, ErrInvalid)
	}
	if owner == "" {
		return fmt.Errorf("%s: %w: empty owner", op, ErrInvalid)
	}
	return nil
}

// active reports whether r still holds back the later rows of its ordering
// key: it is waiting for its first claim, being published, failed and
// waiting for its retry, or halted.
func active(r *Row) bool {
	switch r.Status {
	case StatusPending, StatusProcessing, StatusFailed, StatusHalted:
		return true
	}
	return false
}

// givenUp is the status of a row that failed on its own past its max
// retries: halted if it has a partition key (its key waits for an
// operator), abandoned if not.
func givenUp(r *Row) Status {
	if r.PartitionKey != nil {
		return StatusHalted
	}
	return StatusAbandoned
}

// OrderingKey is what orders rows end to end: rows with one OrderingKey
// reach their broker in ID order. The stores claim by it and the relay
// (internal/relay) groups a claim's runs by it (one definition for both:
// it is exported for that alone, and its fields are not). It is the
// broker, the category and the partition key, whatever the priority: a
// partition worker takes a message at or below its position as applied,
// so a key's rows must reach each of its streams in commit order, and a
// key's rows of two priorities may share a stream. A row without a key is
// ordered by its stream and priority.
type OrderingKey struct {
	broker, category, key string
	priority              int
}

// OrderingKeyOf is row r's ordering key.
func OrderingKeyOf(r *Row) OrderingKey {
	if r.PartitionKey != nil {
		return OrderingKey{broker: r.TargetBroker, category: r.Category, key: *r.PartitionKey}
	}
	return OrderingKey{broker: r.TargetBroker, category: r.Category, key: r.Stream, priority: r.Priority}
}

// claimOrder orders a claim: by priority (higher first), then ID, except
// that the rows of one ordering key keep ID order among the places their
// key holds, so that publishing in claim order keeps each key's order.
func claimOrder(rows []Row) {
	sort.SliceStable(rows, func(i, j int) bool {
		if rows[i].Priority != rows[j].Priority {
			return rows[i].Priority > rows[j].Priority
		}
		return rows[i].ID < rows[j].ID
	})
	places := map[OrderingKey][]int{}
	for i := range rows {
		k := OrderingKeyOf(&rows[i])
		places[k] = append(places[k], i)
	}
	for _, at := range places {
		if len(at) < 2 {
			continue
		}
		keyRows := make([]Row, len(at))
		for j, i := range at {
			keyRows[j] = rows[i]
		}
		sort.Slice(keyRows, func(a, b int) bool { return keyRows[a].ID < keyRows[b].ID })
		for j, i := range at {
			rows[i] = keyRows[j]
		}
	}
}

// eligible reports whether r may be claimed at now, its ordering key aside.
func eligible(r *Row, now time.Time) bool {
	if r.RetryCount >= r.MaxRetries {
		return false
	}
	switch r.Status {
	case StatusPending:
	case StatusFailed:
		if r.NextRetryAt != nil && r.NextRetryAt.After(now) {
			return false
		}
	case StatusProcessing:
		if r.LockedUntil == nil || r.LockedUntil.After(now) {
			return false
		}
	default:
		return false
	}
	return true
}

func copyRow(r Row) Row {
	r.Data = slices.Clone(r.Data)
	r.Metadata = slices.Clone(r.Metadata)
	r.PartitionKey = copyPtr(r.PartitionKey)
	r.NextRetryAt = copyPtr(r.NextRetryAt)
	r.LockedUntil = copyPtr(r.LockedUntil)
	r.PublishedAt = copyPtr(r.PublishedAt)
	return r
}

func copyPtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// refusedText says which of r's names PostgreSQL's text cannot store, and
// why, or "".
func refusedText(r Row) string {
	key := ""
	if r.PartitionKey != nil {
		key = *r.PartitionKey
	}
	for i, s := range [...]string{r.MessageID, r.Stream, r.Category, r.Type, r.TargetBroker, key} {
		if why := jsonnul.RefusedText(s); why != "" {
			return [...]string{"message id", "stream", "category", "type", "target broker", "partition key"}[i] + " " + why
		}
	}
	return ""
}
