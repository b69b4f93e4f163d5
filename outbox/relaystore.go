package outbox

import (
	"context"
	"log/slog"
	"time"
)

// RelayStore is what the relay (internal/relay) needs of an outbox store:
// both stores implement it.
type RelayStore interface {
	Claim(ctx context.Context, broker, owner string, limit int, lockFor time.Duration) ([]Row, error)
	MarkPublishedBatch(ctx context.Context, owner string, ids []int64) error
	MarkFailed(ctx context.Context, id int64, owner, errMsg string, nextRetryAt time.Time) error
	Release(ctx context.Context, owner string, ids []int64) error
	Abandon(ctx context.Context, id int64, reason string) error
	Cleanup(ctx context.Context, publishedBefore, abandonedBefore time.Time) (int, error)
}

// Chainer is a RelayStore whose claim can also tell, for each row, the
// global position of the row before it on its partition stream, which the
// relay sends with each message (delivery.Message.Prev) so that a partition
// worker detects a message its stream lost.
type Chainer interface {
	// ClaimChained is Claim, with each row's Prev: for a row with a
	// partition key, the global position of the newest published row of
	// its broker, category and key with a lower ID that goes to the same
	// stream by lanes (0 if none is kept, and for rows without a key).
	ClaimChained(ctx context.Context, broker, owner string, limit int, lockFor time.Duration, lanes Lanes) ([]Row, error)
}

// MarkingClaimer is a RelayStore that can mark rows published and claim
// the next ones in one round trip: a relay marks its last pass's rows
// with its next claim.
type MarkingClaimer interface {
	// MarkAndClaim runs MarkPublishedBatch(owner, ids), then the claim
	// (ClaimChained with lanes, or Claim when lanes is nil), which sees the
	// marks: their keys' next rows may be claimed at once. markErr is the
	// mark's error as MarkPublishedBatch returns it (ErrNotOwner naming
	// rows another relay took over: the claim still ran); err is any
	// other failure, of either step, and then nothing of either is done.
	MarkAndClaim(ctx context.Context, owner string, ids []int64, broker string, limit int, lockFor time.Duration, lanes *Lanes) (rows []Row, markErr, err error)
}

// Republisher is a RelayStore that can publish again what a broker that
// lost its data (broker.ErrEpochLost) may have lost.
type Republisher interface {
	// Republish makes every row of broker published at or after since
	// pending again, in their order, except those keep says every consumer
	// group applied already, revokes every claim of the broker's
	// rows (their holders can mark nothing more), and records epoch as the
	// broker's,
	// unless stillLost, called under the store's lock, reports that the
	// broker has a marker again (another relay got there first). For a
	// broker with no epoch recorded yet (its first start) it requeues
	// nothing and reports first. It returns how many rows it requeued.
	Republish(ctx context.Context, broker, epoch string, since time.Time, keep Keep,
		stillLost func(context.Context) (bool, error)) (n int, first bool, err error)
	// LastPublished is when the broker's latest published row still kept
	// was marked published, zero if none.
	LastPublished(ctx context.Context, broker string) (time.Time, error)
}

// RelayLeaser is a RelayStore that holds, per broker, a lease saying which
// relay publishes its rows, so that the relays of several hosts do not all
// claim them (each claim then takes a share of the rows, and the claims
// and marks multiply with the hosts). The lease is an economy, not a
// guard: claims stay safe between relays that both believe they hold it,
// so a holder's clock or a lapse it has not noticed yet costs a race, not
// an order or a row.
type RelayLeaser interface {
	// HoldRelay takes broker's lease for owner, or renews it, until now
	// (the store's clock) plus leaseFor, and reports whether owner holds
	// it: it does unless another owner holds a lease that has not
	// expired. A lease is free at exactly its expiry instant, as a claim's
	// lock is.
	HoldRelay(ctx context.Context, broker, owner string, leaseFor time.Duration) (bool, error)
	// ReleaseRelay gives broker's lease up if owner holds it, so that the
	// next HoldRelay of another owner takes it at once.
	ReleaseRelay(ctx context.Context, broker, owner string) error
}

// RelayWaker is a RelayLeaser whose relays wake the lease's holder: a
// relay without the lease, whose host committed rows, asks the holder
// for a pass now, not at the holder's next tick.
type RelayWaker interface {
	RelayLeaser
	// WakeRelay asks broker's relays for a pass.
	WakeRelay(ctx context.Context, broker string) error
	// ListenRelayWakes calls fn for each WakeRelay of broker, by any
	// relay on the store, until ctx ends, and returns ctx's error. A wake
	// sent while it is not listening (while it connects again) is lost,
	// and the holder's tick covers it.
	ListenRelayWakes(ctx context.Context, broker string, log *slog.Logger, fn func()) error
}
