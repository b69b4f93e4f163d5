package local

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/groups"
	"github.com/proteanhq/protean-host/internal/ops"
	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/outbox"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

// Options are what a Service operates. Each part is optional: a host
// without a Redis broker has no partitions, one whose handlers read the
// broker no event-store subscriptions.
type Options struct {
	// Tenancy is the running set's: the tenants of the handlers and
	// categories (TenancyOf).
	Tenancy func() ops.Tenancy
	// Partitions are the partition workers' groups of the running set,
	// and Admin acts on them; nil Admin: this host has no partitions.
	Partitions     func() []partition.Subscription
	Admin          *redispartition.Admin
	BackfillSuffix string
	// Subscriptions are the event-store subscriptions of the running
	// set, read through Positions, Leases, Head and Failures.
	Subscriptions func() []subscription.Subscription
	// Stored, if set, lists the subscriptions in place of Subscriptions:
	// the CLI's direct access, which loads no plugins, lists every
	// subscription that has a positions row, of handlers no longer
	// loaded too.
	Stored    func(ctx context.Context) ([]subscription.Subscription, error)
	Positions interface {
		Get(ctx context.Context, group, unit string) (position.Row, bool, error)
	}
	Leases interface {
		Holder(ctx context.Context, group, unit string) (string, time.Time, bool, error)
	}
	Head     func(ctx context.Context, category string) (int64, error)
	Failures subscription.Failures
	// DeadLetters is the broker's dead-letter queues (nil: it keeps
	// none), and Groups the running broker groups, whose dead letters
	// ReplayDeadLetter replays. A broker that lists every dead letter it
	// keeps (redisstream's) is listed whole, groups that no longer run
	// and partitions' included; another is asked for each of Groups'.
	DeadLetters broker.DeadLetterer
	Groups      func() []groups.Group
	Outbox      outbox.Store
	Audit       audit.Log
}

// Service is the API over a host's stores.
type Service struct{ o Options }

// New returns the Service of o. It needs o.Tenancy, o.Outbox and o.Audit.
func New(o Options) (*Service, error) {
	if o.Tenancy == nil || o.Outbox == nil || o.Audit == nil {
		return nil, errors.New("ops: Options.Tenancy, Options.Outbox and Options.Audit are required")
	}
	return &Service{o: o}, nil
}

var _ ops.API = (*Service)(nil)

// tenants maps each handler of the running set to its module's tenant.
func (s *Service) tenants() map[string]string { return s.o.Tenancy().Handlers }

// record appends the audit entry of an action on target of tenant that
// ended with err, and returns its id and err, or the audit's error if
// the entry could not be kept.
func (s *Service) record(ctx context.Context, act ops.Act, kind, tenant, target string, err error) (int64, error) {
	id, aerr := s.o.Audit.Append(context.WithoutCancel(ctx), audit.Entry{Principal: act.By, Tenant: tenant, Action: kind + "." + act.Action,
		Target: target, Outcome: audit.Outcome(err), Reason: act.Reason})
	if aerr != nil {
		return 0, errors.Join(err, fmt.Errorf("the action's audit entry was not kept: %w", aerr))
	}
	return id, err
}

// errNoPartitions: the host has no Redis partitions.
var errNoPartitions = fmt.Errorf("%w: this host has no partitions (they live on a Redis broker, with the partition workers)", ops.ErrNotFound)

// hidden is ErrNotFound for a scope that may know, else ErrForbidden.
func hidden(sc ops.Scope, err error) error {
	if sc.IsAll() {
		return err
	}
	return ops.ErrForbidden
}

// Partitions implements API.
func (s *Service) Partitions(ctx context.Context, sc ops.Scope) ([]ops.Partition, error) {
	if s.o.Admin == nil {
		return []ops.Partition{}, nil // partitions live on a Redis broker, with the partition workers
	}
	sts, err := s.o.Admin.List(ctx, s.o.Partitions())
	if err != nil {
		return nil, err
	}
	ts := s.tenants()
	out := []ops.Partition{}
	for _, st := range sts {
		if t := ts[st.Group]; sc.Has(t) {
			out = append(out, partitionOf(t, st))
		}
	}
	return out, nil
}

func partitionOf(tenant string, st redispartition.Status) ops.Partition {
	p := ops.Partition{Tenant: tenant, Category: st.Category, Key: st.Key, Group: st.Group, Owner: st.Owner, Generation: st.Generation,
		Pending: st.Pending, Lag: st.Lag, State: st.State()}
	if h := st.Halt; h != nil {
		p.Halt = &ops.Halt{Stream: h.Stream, Entry: h.Entry, MessageID: h.MessageID, Attempts: h.Attempts, HaltedAt: h.HaltedAt,
			Generation: h.Generation, Reason: h.Reason}
	}
	return p
}

// unitOf names the partition of key in category, refusing a pair that is
// not read back as itself (a key with a colon, an empty one): the unit
// would name another partition.
func (s *Service) unitOf(category, key string) (string, error) {
	unit := partition.PartitionUnit(category, key)
	c, k, err := partition.ParseUnit(unit, s.o.BackfillSuffix)
	if err == nil && (c != category || k != key) {
		err = fmt.Errorf("%w: category %q and key %q name partition %q of category %q", partition.ErrInvalidUnit, category, key, k, c)
	}
	if err != nil {
		return "", fmt.Errorf("%w: %w", ops.ErrInvalid, err)
	}
	return unit, nil
}

// groupsOf returns the groups partition unit of category belongs to: the
// handlers reading the partitioned category or the correlated process
// manager named category, and the groups it is halted in, each with its
// tenant, in the order the subscriptions give them; and the groups it is
// halted in (one SCAN of the halt records, which the caller reuses).
func (s *Service) groupsOf(ctx context.Context, category, unit string) ([]partition.Subscription, map[string]string, []string, error) {
	var out []partition.Subscription
	seen := map[string]bool{}
	for _, sub := range s.o.Partitions() {
		if (sub.Correlated && sub.Group == category) || (!sub.Correlated && slices.Contains(sub.Categories, category)) {
			out = append(out, sub)
			seen[sub.Group] = true
		}
	}
	halted, err := s.o.Admin.HaltedGroups(ctx, unit)
	if err != nil {
		return nil, nil, nil, err
	}
	for _, g := range halted {
		if !seen[g] {
			// A halted unit of a removed handler is still worth seeing.
			out = append(out, partition.Subscription{Group: g, Categories: []string{category}})
		}
	}
	return out, s.tenants(), halted, nil
}

// Partition implements API.
func (s *Service) Partition(ctx context.Context, sc ops.Scope, category, key string) ([]ops.PartitionDetail, error) {
	if s.o.Admin == nil {
		return nil, hidden(sc, errNoPartitions)
	}
	unit, err := s.unitOf(category, key)
	if err != nil {
		return nil, err
	}
	subs, ts, _, err := s.groupsOf(ctx, category, unit)
	if err != nil {
		return nil, err
	}
	var out []ops.PartitionDetail
	for _, sub := range subs {
		t := ts[sub.Group]
		if !sc.Has(t) {
			continue
		}
		d, err := s.o.Admin.Inspect(ctx, sub, unit)
		if err != nil {
			return nil, err
		}
		pd := ops.PartitionDetail{Partition: partitionOf(t, d.Status), Streams: d.Sources, Positions: d.Positions, Entries: []ops.Entry{}}
		for _, e := range d.Entries {
			state := "new"
			switch {
			case e.Halted:
				state = "halted"
			case e.Pending:
				state = "pending"
			}
			pd.Entries = append(pd.Entries, ops.Entry{Stream: e.Stream, ID: e.ID, State: state, Deliveries: e.Deliveries, Failures: e.Failures,
				MessageID: e.MessageID, Type: e.Type, GlobalPosition: e.GlobalPosition, Data: e.Data, Problem: e.Problem})
		}
		out = append(out, pd)
	}
	if len(out) == 0 {
		return nil, hidden(sc, fmt.Errorf("%w: no handler reads partitioned category %s (or is a correlated process manager of that name), and %s is not halted in any group",
			ops.ErrNotFound, category, unit))
	}
	return out, nil
}

// ActOnPartition implements API.
func (s *Service) ActOnPartition(ctx context.Context, sc ops.Scope, act ops.Act, category, key, group string) (ops.Done, error) {
	if s.o.Admin == nil {
		return ops.Done{}, hidden(sc, errNoPartitions)
	}
	switch act.Action {
	case "skip", "dlq", "resume":
	default:
		return ops.Done{}, fmt.Errorf("%w: a partition's action is skip, dlq or resume, not %q", ops.ErrInvalid, act.Action)
	}
	unit, err := s.unitOf(category, key)
	if err != nil {
		return ops.Done{}, err
	}
	subs, ts, halted, err := s.groupsOf(ctx, category, unit)
	if err != nil {
		return ops.Done{}, err
	}
	mine := false // a group in scope reads the partition
	for _, sub := range subs {
		mine = mine || (sc.Has(ts[sub.Group]) && (group == "" || sub.Group == group))
	}
	if !mine {
		return ops.Done{}, hidden(sc, fmt.Errorf("%w: no handler %sreads partition %s", ops.ErrNotFound, orEmpty(group, "%s "), unit))
	}
	tenant, target := "", unit
	if group == "" {
		group, err = haltedGroup(sc, ts, halted, unit)
		// Several of the scope's groups read the partition: the tenant
		// of the record is theirs if they share one.
		for _, sub := range subs {
			if t := ts[sub.Group]; sc.Has(t) && (tenant == "" || tenant == t) {
				tenant = t
			}
		}
	}
	var out redispartition.Outcome
	if err == nil {
		tenant, target = ts[group], unit+" group "+group
		out, err = s.act(ctx, act, group, unit)
	}
	id, err := s.record(ctx, act, "partitions", tenant, target, err)
	if err != nil {
		return ops.Done{}, err
	}
	h := out.Halt
	msg := cmp.Or(h.MessageID, "-")
	d := ops.Done{Tenant: tenant, Action: act.Action, Target: target, Audit: id}
	switch act.Action {
	case "skip":
		d.Detail = fmt.Sprintf("skipped entry %s of %s (message %s) for group %s; acked: %v; the partition is released", h.Entry, h.Stream, msg, group, out.Acked)
	case "dlq":
		d.Detail = fmt.Sprintf("moved entry %s of %s (message %s) for group %s to %s as %s; the partition is released", h.Entry, h.Stream, msg, group, out.DLQStream, out.DLQEntry)
	default:
		d.Detail = fmt.Sprintf("resumed %s for group %s: entry %s (message %s) is retried with fresh attempts; the partition is released", unit, group, h.Entry, msg)
	}
	return d, nil
}

// haltedGroup returns the one group of the scope, among halted, that
// unit is halted in.
func haltedGroup(sc ops.Scope, ts map[string]string, halted []string, unit string) (string, error) {
	var in []string
	for _, g := range halted {
		if sc.Has(ts[g]) {
			in = append(in, g)
		}
	}
	switch len(in) {
	case 0:
		return "", fmt.Errorf("%w: partition %s is not halted in any consumer group", ops.ErrConflict, unit)
	case 1:
		return in[0], nil
	}
	return "", fmt.Errorf("%w: partition %s is halted in groups %v: choose one", ops.ErrConflict, unit, in)
}

// act does act.Action to the halted unit of group.
func (s *Service) act(ctx context.Context, act ops.Act, group, unit string) (redispartition.Outcome, error) {
	op := redispartition.Operator{By: act.By, Reason: act.Reason}
	var out redispartition.Outcome
	var err error
	switch act.Action {
	case "skip":
		out, err = s.o.Admin.Skip(ctx, group, unit, op)
	case "dlq":
		out, err = s.o.Admin.DLQ(ctx, group, unit, op)
	default:
		out, err = s.o.Admin.Resume(ctx, group, unit, op)
	}
	if errors.Is(err, redispartition.ErrNotHalted) || errors.Is(err, redispartition.ErrHaltChanged) || errors.Is(err, redispartition.ErrEntryGone) {
		err = fmt.Errorf("%w: %w", ops.ErrConflict, err)
	}
	return out, err
}

func orEmpty(v, format string) string {
	if v == "" {
		return ""
	}
	return fmt.Sprintf(format, v)
}

// Subscriptions implements API.
func (s *Service) Subscriptions(ctx context.Context, sc ops.Scope) ([]ops.Subscription, error) {
	out := []ops.Subscription{}
	var subs []subscription.Subscription
	switch {
	case s.o.Stored != nil:
		var err error
		if subs, err = s.o.Stored(ctx); err != nil {
			return nil, err
		}
	case s.o.Subscriptions != nil:
		subs = s.o.Subscriptions()
	}
	ts := s.tenants()
	for _, sub := range subs {
		t := ts[sub.Group]
		if !sc.Has(t) {
			continue
		}
		row, _, err := s.o.Positions.Get(ctx, sub.Group, sub.Category)
		if err != nil {
			return nil, err
		}
		o := ops.Subscription{Tenant: t, Group: sub.Group, Unit: sub.Category, Position: row.Positions[sub.Category], Generation: row.Generation}
		if s.o.Head != nil {
			if o.Head, err = s.o.Head(ctx, sub.Category); err != nil {
				return nil, err
			}
			o.Lag = max(0, o.Head-o.Position)
		}
		if s.o.Leases != nil {
			owner, exp, ok, err := s.o.Leases.Holder(ctx, sub.Group, sub.Category)
			if err != nil {
				return nil, err
			}
			if ok {
				o.Owner, o.LeaseExpires = owner, &exp
			}
		}
		if s.o.Failures != nil {
			open, err := s.o.Failures.List(ctx, sub.Group, sub.Category, true)
			if err != nil {
				return nil, err
			}
			o.OpenFailures = len(open)
		}
		out = append(out, o)
	}
	return out, nil
}

// Failures implements API.
func (s *Service) Failures(ctx context.Context, sc ops.Scope, all bool) ([]ops.Failure, error) {
	out := []ops.Failure{}
	if s.o.Failures == nil {
		return out, nil
	}
	fs, err := s.o.Failures.List(ctx, "", "", !all)
	if err != nil {
		return nil, err
	}
	ts := s.tenants()
	for _, f := range fs {
		if t := ts[f.Group]; sc.Has(t) {
			out = append(out, ops.Failure{Tenant: t, Group: f.Group, Unit: f.Unit, Position: f.GlobalPosition, Status: string(f.Status), Key: f.Key,
				Type: f.Type, Stream: f.Stream, MessageID: f.MessageID, Attempts: f.Attempts, Error: f.Error, FailedAt: f.FailedAt})
		}
	}
	return out, nil
}

// ActOnFailure implements API.
func (s *Service) ActOnFailure(ctx context.Context, sc ops.Scope, act ops.Act, group, unit string, pos int64) (ops.Done, error) {
	if act.Action != "retry" && act.Action != "skip" {
		return ops.Done{}, fmt.Errorf("%w: a failure record's action is retry or skip, not %q", ops.ErrInvalid, act.Action)
	}
	if pos <= 0 {
		return ops.Done{}, fmt.Errorf("%w: a failure record's position is a global position > 0 (got %d)", ops.ErrInvalid, pos)
	}
	tenant := s.tenants()[group]
	if !sc.Has(tenant) {
		return ops.Done{}, hidden(sc, fmt.Errorf("%w: no failure record of group %s at %s %d", ops.ErrNotFound, group, unit, pos))
	}
	if s.o.Failures == nil {
		return ops.Done{}, hidden(sc, fmt.Errorf("%w: the handlers read the broker, not the event store: there are no failure records", ops.ErrNotFound))
	}
	err := s.o.Failures.Mark(ctx, group, unit, pos, act.Action)
	switch {
	case errors.Is(err, subscription.ErrNotFound):
		err = fmt.Errorf("%w: %w", ops.ErrNotFound, err)
	case errors.Is(err, subscription.ErrStatus):
		err = fmt.Errorf("%w: %w", ops.ErrConflict, err)
	case errors.Is(err, subscription.ErrInvalid):
		err = fmt.Errorf("%w: %w", ops.ErrInvalid, err)
	}
	target := fmt.Sprintf("%s/%s@%d", group, unit, pos)
	id, err := s.record(ctx, act, "subscriptions", tenant, target, err)
	if err != nil {
		return ops.Done{}, err
	}
	return ops.Done{Tenant: tenant, Action: act.Action, Target: target, Audit: id,
		Detail: fmt.Sprintf("the message at %d is marked for %s; its owner acts within its poll interval", pos, act.Action)}, nil
}

// Outbox implements API.
func (s *Service) Outbox(ctx context.Context, sc ops.Scope) (ops.Outbox, error) {
	st, err := s.o.Outbox.Stats(ctx)
	if err != nil {
		return ops.Outbox{}, err
	}
	out := ops.Outbox{Rows: []ops.OutboxRow{}}
	if sc.IsAll() {
		out.Counts = map[string]int{}
		for k, n := range st.Counts {
			out.Counts[string(k)] = n
		}
		out.OldestPending = st.OldestPending
		for _, l := range st.RelayLeases {
			out.RelayLeases = append(out.RelayLeases, ops.RelayLease{Broker: l.Broker, Owner: l.Owner, Expires: l.Expires})
		}
	}
	owner := s.o.Tenancy().Owner
	for _, a := range st.Abandoned {
		t := owner(a.Category)
		if sc.Has(t) {
			out.Rows = append(out.Rows, ops.OutboxRow{Tenant: t, ID: a.ID, Status: string(a.Status), Category: a.Category, Key: a.Key,
				MessageID: a.MessageID, Broker: a.TargetBroker, Retries: a.RetryCount, LastError: a.LastError, CreatedAt: a.CreatedAt})
		}
	}
	sort.Slice(out.Rows, func(i, j int) bool { return out.Rows[i].ID < out.Rows[j].ID })
	return out, nil
}

// ActOnOutbox implements API.
func (s *Service) ActOnOutbox(ctx context.Context, sc ops.Scope, act ops.Act, id int64) (ops.Done, error) {
	if act.Action != "retry" && act.Action != "skip" {
		return ops.Done{}, fmt.Errorf("%w: an outbox row's action is retry or skip, not %q", ops.ErrInvalid, act.Action)
	}
	r, err := s.o.Outbox.Get(ctx, id)
	if errors.Is(err, outbox.ErrNotFound) {
		return ops.Done{}, hidden(sc, fmt.Errorf("%w: outbox row %d", ops.ErrNotFound, id))
	}
	if err != nil {
		return ops.Done{}, err
	}
	tenant := s.o.Tenancy().Owner(r.Category)
	if !sc.Has(tenant) {
		return ops.Done{}, ops.ErrForbidden
	}
	detail := fmt.Sprintf("outbox row %d is pending again", id)
	if act.Action == "retry" {
		err = s.o.Outbox.Retry(ctx, id)
	} else {
		// A halted row holds back its key; skipping it lets the key's
		// later rows go on without it. Its event stays in the event
		// store; no consumer of the broker will see it.
		detail = fmt.Sprintf("outbox row %d skipped (abandoned): the later rows of its key go on without it", id)
		if r.Status != outbox.StatusHalted && r.Status != outbox.StatusFailed {
			err = fmt.Errorf("outbox row %d is %s: only a halted or failed row can be skipped: %w", id, r.Status, outbox.ErrStatus)
		} else {
			err = s.o.Outbox.Abandon(ctx, id, "skipped by an operator ("+act.By+")")
		}
	}
	if errors.Is(err, outbox.ErrStatus) || errors.Is(err, outbox.ErrPassed) {
		err = fmt.Errorf("%w: %w", ops.ErrConflict, err)
	}
	target := fmt.Sprintf("outbox row %d (%s)", id, r.Category)
	aid, err := s.record(ctx, act, "outbox", tenant, target, err)
	if err != nil {
		return ops.Done{}, err
	}
	return ops.Done{Tenant: tenant, Action: act.Action, Target: target, Detail: detail, Audit: aid}, nil
}

// Audit implements API.
func (s *Service) Audit(ctx context.Context, sc ops.Scope, q audit.Query) ([]audit.Entry, error) {
	q.Tenants = sc.List()
	return s.o.Audit.List(ctx, q)
}
