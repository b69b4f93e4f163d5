package outbox

import (
	"context"
	"encoding/json"

	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

// Lanes is how a partitioned row is routed on a partitioning broker: to its
// partition stream {category}:{key}, or, when Enabled and its priority is
// below Threshold, to the backfill lane {category}:{key}:{Suffix}. The
// relay publishes by it and a republish reads the positions by it.
type Lanes struct {
	Enabled   bool
	Threshold int
	Suffix    string
}

// Stream is the stream a row with a partition key goes to.
func (l Lanes) Stream(row Row) string {
	if l.lane(row) {
		return partition.LaneStreamName(row.Category, *row.PartitionKey, l.Suffix)
	}
	return partition.StreamName(row.Category, *row.PartitionKey)
}

// lane reports whether row goes to the backfill lane.
func (l Lanes) lane(row Row) bool { return l.Enabled && row.Priority < l.Threshold }

// globalPosition is the event's global position the unit of work wrote in
// the row's metadata (0 if there is none).
func globalPosition(row *Row) int64 {
	var md struct {
		GlobalPosition int64 `json:"global_position"`
	}
	if json.Unmarshal(row.Metadata, &md) != nil {
		return 0
	}
	return md.GlobalPosition
}

// Applier is one partition consumer group applying the rows of Category:
// the row of key k is applied once the group's consumer position of unit
// UnitPrefix + ":" + k on the row's stream is at or past the row's global
// position.
type Applier struct {
	Group, Category, UnitPrefix string
}

// Keep names the rows a republish may leave published: the partitioned
// rows of a category that has appliers and that every one of them has
// applied, by the table of consumer positions, and that no other group
// with a position on the row's unit {category}:{key} and stream lags
// behind (a group only another host runs, in the middle of a rolling
// reload). The rest go again. A zero Keep keeps nothing (every row within
// the window goes again).
type Keep struct {
	Appliers []Applier
	Lanes    Lanes
}

// KeepFor is the Keep of the partition consumer groups subs: a handler on
// a category applies it as the units {category}:{key}, a correlated process
// manager as {group}:{key}.
func KeepFor(subs []partition.Subscription, lanes Lanes) Keep {
	k := Keep{Lanes: lanes}
	for _, s := range subs {
		for _, c := range s.Categories {
			prefix := c
			if s.Correlated {
				prefix = s.Group
			}
			k.Appliers = append(k.Appliers, Applier{Group: s.Group, Category: c, UnitPrefix: prefix})
		}
	}
	return k
}

// columns are the Keep as the arrays the PostgreSQL republish takes.
func (k Keep) columns() (categories, groups, prefixes []string) {
	// Never nil: a NULL array would make the condition NULL and keep
	// every row.
	categories, groups, prefixes = []string{}, []string{}, []string{}
	for _, a := range k.Appliers {
		categories = append(categories, a.Category)
		groups = append(groups, a.Group)
		prefixes = append(prefixes, a.UnitPrefix)
	}
	return categories, groups, prefixes
}

// applied reports whether every applier of row's category has applied it
// by positions (false if the category has none, or the row no key or no
// global position). The memory store's rule; the PostgreSQL store's
// republish is the same rule in SQL.
//
// others are every group's positions rows, by unit (nil: none read).
func (k Keep) applied(ctx context.Context, positions position.Store, others map[string][]position.Row, row *Row) (bool, error) {
	if positions == nil || row.PartitionKey == nil {
		return false, nil
	}
	gp := globalPosition(row)
	if gp <= 0 {
		return false, nil
	}
	stream, found := k.Lanes.Stream(*row), false
	for _, a := range k.Appliers {
		if a.Category != row.Category {
			continue
		}
		found = true
		p, ok, err := positions.Get(ctx, a.Group, a.UnitPrefix+":"+*row.PartitionKey)
		if err != nil {
			return false, err
		}
		if !ok || p.Positions[stream] < gp {
			return false, nil
		}
	}
	if !found {
		return false, nil
	}
	for _, p := range others[row.Category+":"+*row.PartitionKey] {
		if at, ok := p.Positions[stream]; ok && at < gp {
			return false, nil // another group is behind on the stream
		}
	}
	return true, nil
}

// unitRows lists every group's positions rows by unit, for applied.
func unitRows(ctx context.Context, positions position.Store) (map[string][]position.Row, error) {
	if positions == nil {
		return nil, nil
	}
	rows, err := positions.List(ctx, "")
	if err != nil {
		return nil, err
	}
	out := map[string][]position.Row{}
	for _, r := range rows {
		out[r.Unit] = append(out[r.Unit], r)
	}
	return out, nil
}
