package partition

import (
	"context"

	"github.com/proteanhq/protean-host/position"
)

// Subscription is one consumer group (a handler) reading partitioned
// categories.
type Subscription struct {
	Group      string
	Categories []string
	// Correlated makes one unit per key value across all Categories (a
	// process manager with sequential_by = true, whose categories are all
	// partitioned by its correlate field); otherwise each category's keys
	// are units of their own.
	Correlated bool
}

// Positions is the consumer-positions store a new owner claims its unit in.
type Positions interface {
	Claim(ctx context.Context, group, unit string) (position.Row, error)
	ClaimAll(ctx context.Context, group string, units []string) ([]position.Row, error)
	position.Reader
}
