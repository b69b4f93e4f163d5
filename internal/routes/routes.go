package routes

import (
	"sort"
	"sync"
	"sync/atomic"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/groups"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/partition"
)

// Table is where one module set sends messages, as each delivery source
// and the unit of work read it.
type Table struct {
	fields        map[string]string // category -> its partition field
	partitions    []partition.Subscription
	subscriptions []subscription.Subscription
	groups        []groups.Group
}

// Of is set's table. With partitioned, the partition workers deliver the
// partitioned categories, so the broker groups leave them alone.
func Of(set *host.Set, partitioned bool) *Table {
	t := &Table{fields: map[string]string{}}
	for c, k := range set.Keys() {
		t.fields[c] = k.Field
	}
	t.partitions = partitionSubscriptions(set)
	for _, s := range set.Subscriptions() {
		field, keyed := t.fields[s.Category]
		t.subscriptions = append(t.subscriptions, subscription.Subscription{Group: s.Handler, Category: s.Category,
			Partitioned: keyed, KeyField: field})
		if !(keyed && partitioned) {
			t.groups = append(t.groups, groups.Group{Handler: s.Handler, Stream: s.Category})
		}
	}
	return t
}

// PartitionField is a category's partition key field (its sequential_by):
// what the unit of work keys its outbox rows by (unitofwork.Keys).
func (t *Table) PartitionField(category string) (string, bool) {
	f, ok := t.fields[category]
	return f, ok
}

// Partitions lists the consumer groups the partition workers run: every
// event handler, projector and process manager that reads a partitioned
// category (whether or not it declared sequential_by itself: the
// category's events live on partition streams). A process manager with
// sequential_by = true owns a correlation value across all its
// partitioned categories.
func (t *Table) Partitions() []partition.Subscription { return t.partitions }

// Subscriptions lists the event-store subscriptions: one per (handler,
// category) pair of every event handler, projector and process manager,
// the group being the handler's name. A subscription of a partitioned
// category is Partitioned, keyed by its sequential_by field.
func (t *Table) Subscriptions() []subscription.Subscription { return t.subscriptions }

// Groups lists the broker consumer groups: one per (handler, category)
// pair, but the partitioned categories when the partition workers deliver
// them.
func (t *Table) Groups() []groups.Group { return t.groups }

func partitionSubscriptions(set *host.Set) []partition.Subscription {
	var out []partition.Subscription
	for _, m := range set.Modules() {
		for _, h := range m.Manifest.Handlers {
			if h.Kind == abi.KindCommandHandler {
				continue
			}
			seen := map[string]bool{}
			var cats []string
			for _, typ := range h.Handles {
				msg, _ := set.Message(typ)
				if _, ok := set.PartitionField(msg.Category); ok && !seen[msg.Category] {
					seen[msg.Category] = true
					cats = append(cats, msg.Category)
				}
			}
			if len(cats) == 0 {
				continue
			}
			sort.Strings(cats)
			out = append(out, partition.Subscription{Group: h.Name, Categories: cats,
				Correlated: h.Kind == abi.KindProcessManager && h.SequentialBy.Correlation})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	return out
}

// Routes is the running table. Swap replaces it whole and then tells the
// components that follow it; every reader sees one table or the next,
// never a mix.
type Routes struct {
	partitioned bool
	cur         atomic.Pointer[Table]

	mu        sync.Mutex
	followers []func()
}

// New returns the routes of set (see Of).
func New(set *host.Set, partitioned bool) *Routes {
	r := &Routes{partitioned: partitioned}
	r.cur.Store(Of(set, partitioned))
	return r
}

// Swap makes set's table the running one, then calls every follower, in
// the order they were added.
func (r *Routes) Swap(set *host.Set) {
	r.cur.Store(Of(set, r.partitioned))
	r.mu.Lock()
	fs := append([]func(){}, r.followers...)
	r.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// Follow adds f to what Swap calls once the new table is running (a
// component that must act on a change, not only read the next table:
// the broker groups' Resubscribe).
func (r *Routes) Follow(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.followers = append(r.followers, f)
}

// Table is the running table.
func (r *Routes) Table() *Table { return r.cur.Load() }

// PartitionField reads the running table (unitofwork.Keys).
func (r *Routes) PartitionField(category string) (string, bool) {
	return r.Table().PartitionField(category)
}

// Partitions reads the running table.
func (r *Routes) Partitions() []partition.Subscription { return r.Table().Partitions() }

// Subscriptions reads the running table.
func (r *Routes) Subscriptions() []subscription.Subscription { return r.Table().Subscriptions() }

// Groups reads the running table.
func (r *Routes) Groups() []groups.Group { return r.Table().Groups() }
