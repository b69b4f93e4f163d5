package redispartition

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

// Errors of the operator actions. Calls wrap them with the group and unit;
// test with errors.Is.
var (
	// ErrNotHalted: skip, dlq and resume act only on a halted unit. The
	// *StateError that wraps it names the unit's state.
	ErrNotHalted = errors.New("partition not halted")
	// ErrEntryGone: dlq found the halted head entry no longer in its stream,
	// so there is nothing to copy; it refuses rather than ack a message it
	// cannot keep.
	ErrEntryGone = errors.New("halted entry no longer in its stream")
	// ErrHaltChanged: the halt record changed between reading it and acting
	// on it (another operator acted, or the unit halted again elsewhere).
	ErrHaltChanged = errors.New("halt record changed while acting on it")
)

// StateError is ErrNotHalted with the state the unit was found in.
type StateError struct {
	Group, Unit string
	// State is "owned by OWNER at generation N" or "not halted".
	State string
}

func (e *StateError) Error() string {
	return fmt.Sprintf("partition %s %s: %s: %v", e.Group, e.Unit, e.State, ErrNotHalted)
}

// Unwrap returns ErrNotHalted.
func (e *StateError) Unwrap() error { return ErrNotHalted }

// AdminOptions configure an Admin. Redis is required.
type AdminOptions struct {
	Redis  redis.UniversalClient
	Prefix string
	// Positions is read for each unit's committed positions; nil leaves
	// them out (the memory store lives inside a running host).
	Positions position.Store
	// BackfillSuffix names each source's lane, counted in pending and lag.
	BackfillSuffix string
	// Decode turns an entry back into a message for Inspect
	// (redisstream.Decode; that package imports this one, so it is passed
	// in). Nil shows the raw id and type fields.
	Decode func(id string, values map[string]any) (delivery.Message, error)
	// InspectLimit caps the entries Inspect shows per stream (default 10).
	InspectLimit int
	Now          func() time.Time
}

// Admin is what an operator sees and does on partitions: list, inspect,
// and the three ways out of a halt (skip, dlq, resume). Each action is one
// Lua script, so the ack, the halt's removal and the audit record happen
// together or not at all. A live host needs no restart: the action then
// announces the unit's key on its category's wake-up stream, so a host
// with room acquires it at once; if that announcement fails, discovery
// finds the unit within a walk of the index (the next heartbeat up to
// 1,000 keys, at most 20 heartbeats).
type Admin struct {
	rdb       redis.UniversalClient
	prefix    string
	positions position.Store
	suffix    string
	limit     int
	decode    func(id string, values map[string]any) (delivery.Message, error)
	now       func() time.Time
}

// NewAdmin returns the operator view over opts.Redis.
func NewAdmin(opts AdminOptions) (*Admin, error) {
	if opts.Redis == nil {
		return nil, errors.New("partition: admin needs a Redis client")
	}
	if opts.BackfillSuffix == "" {
		opts.BackfillSuffix = partition.DefaultBackfillSuffix
	}
	if opts.InspectLimit <= 0 {
		opts.InspectLimit = 10
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Admin{rdb: opts.Redis, prefix: opts.Prefix, positions: opts.Positions, suffix: opts.BackfillSuffix,
		limit: opts.InspectLimit, decode: opts.Decode, now: opts.Now}, nil
}

func (a *Admin) key(k string) string { return a.prefix + k }

// Status is one consumer group's view of one unit.
type Status struct {
	Group, Unit string
	// Category is the unit's category, or the process manager's name for a
	// correlated unit; Key is the partition key or correlation value.
	Category, Key string
	// Sources are the unit's partition streams (without lanes).
	Sources []string
	// Owner and Generation come from the lease; empty and 0 when unowned.
	Owner      string
	Generation int64
	// Pending counts the group's delivered, unacknowledged entries across
	// the sources and their lanes.
	Pending int64
	// Lag counts entries not yet delivered to the group (XINFO GROUPS lag);
	// a stream the group has not read yet counts whole.
	Lag int64
	// Halt is the durable halt record; nil when the unit is not halted.
	Halt *Halt
	// Positions are the committed global positions per source, from the
	// positions store; nil without a store or a row.
	Positions map[string]int64
	// Indexed is false for a unit found only by its halt record (its key
	// left the index, or its group is not among the subscriptions).
	Indexed bool
}

// State is "halted", "owned" or "idle".
func (s Status) State() string {
	switch {
	case s.Halt != nil:
		return "halted"
	case s.Owner != "":
		return "owned"
	}
	return "idle"
}

// HeadEntry is one entry at the head of a unit's stream, as Inspect shows
// it: the group's pending entries first, then the next undelivered ones.
type HeadEntry struct {
	Stream, ID string
	// Pending: delivered to Consumer Deliveries times and not acked.
	Pending    bool
	Consumer   string
	Deliveries int64
	// Failures counts the entry's failed attempts of its own (kept in
	// Redis across owners; a worker retries a failing message in place,
	// so this, not Deliveries, is what the retry policy counts).
	Failures int64
	// Halted marks the entry the unit halted on.
	Halted         bool
	MessageID      string
	Type           string
	GlobalPosition int64
	// Data is the message's data, cut to 200 bytes.
	Data string
	// Problem is why the entry could not be shown: it failed to decode,
	// or it is pending but no longer in the stream.
	Problem string
}

// Detail is Inspect's answer.
type Detail struct {
	Status
	Entries []HeadEntry
}

// List returns every unit of subs (from their categories' indexes) with its
// state, plus every halted unit under the prefix that none of them names,
// ordered by category, key, group.
func (a *Admin) List(ctx context.Context, subs []partition.Subscription) ([]Status, error) {
	var out []Status
	seen := map[unitID]bool{}
	bySub := map[string]partition.Subscription{}
	for _, s := range subs {
		bySub[s.Group] = s
		units, err := a.units(ctx, s)
		if err != nil {
			return nil, err
		}
		for _, u := range units {
			st, err := a.status(ctx, s.Group, u)
			if err != nil {
				return nil, err
			}
			st.Indexed = true
			seen[unitID{s.Group, u.unit}] = true
			out = append(out, st)
		}
	}
	halts, err := a.scanHalts(ctx)
	if err != nil {
		return nil, err
	}
	for _, id := range halts {
		if seen[id] {
			continue
		}
		u, err := a.resolve(bySub[id.group], id.group, id.unit)
		if err != nil {
			return nil, err
		}
		st, err := a.status(ctx, id.group, u)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool {
		x, y := out[i], out[j]
		if x.Category != y.Category {
			return x.Category < y.Category
		}
		if x.Key != y.Key {
			return x.Key < y.Key
		}
		return x.Group < y.Group
	})
	return out, nil
}

// Inspect returns the unit's status and the entries at the head of each of
// its streams. sub names the group and, for a correlated unit, the
// categories it spans; a sub with no categories reads the unit's own
// stream.
func (a *Admin) Inspect(ctx context.Context, sub partition.Subscription, unit string) (Detail, error) {
	u, err := a.resolve(sub, sub.Group, unit)
	if err != nil {
		return Detail{}, err
	}
	st, err := a.status(ctx, sub.Group, u)
	if err != nil {
		return Detail{}, err
	}
	for _, cat := range sub.Categories {
		if sub.Correlated {
			break
		}
		if cat == st.Category {
			st.Indexed, err = a.rdb.SIsMember(ctx, a.key(IndexKey(cat)), st.Key).Result()
			if err != nil {
				return Detail{}, fmt.Errorf("partition %s %s: index: %w", sub.Group, unit, err)
			}
		}
	}
	d := Detail{Status: st}
	for _, stream := range a.withLanes(u.sources) {
		es, err := a.head(ctx, sub.Group, unit, stream, st.Halt)
		if err != nil {
			return Detail{}, fmt.Errorf("partition %s %s: %w", sub.Group, unit, err)
		}
		d.Entries = append(d.Entries, es...)
	}
	return d, nil
}

// resolve names a unit's category, key and sources: a correlated unit
// "{pm}:{value}" spans each of sub's categories; any other unit is
// "{category}:{key}" with one stream (or one of its lane streams; see
// ParseUnit). A halted unit also reads the stream it
// halted on.
func (a *Admin) resolve(sub partition.Subscription, group, name string) (unit, error) {
	u := unit{unit: name, cat: map[string]string{}}
	if sub.Correlated && strings.HasPrefix(name, group+":") {
		u.key, u.label = strings.TrimPrefix(name, group+":"), group
		for _, c := range sub.Categories {
			s := partition.StreamName(c, u.key)
			u.sources = append(u.sources, s)
			u.cat[s] = c
		}
		return u, nil
	}
	cat, key, err := partition.ParseUnit(name, a.suffix)
	if err != nil {
		return unit{}, fmt.Errorf("partition %s: %w", group, err)
	}
	u.unit = partition.PartitionUnit(cat, key)
	u.label = cat
	u.key = key
	s := partition.StreamName(cat, key)
	u.sources = []string{s}
	u.cat[s] = cat
	return u, nil
}

// units lists a subscription's units from its categories' indexes, as the
// consumer's discovery does.
func (a *Admin) units(ctx context.Context, s partition.Subscription) ([]unit, error) {
	keys := map[string][]string{}
	for _, cat := range s.Categories {
		ks, err := a.rdb.SMembers(ctx, a.key(IndexKey(cat))).Result()
		if err != nil {
			return nil, fmt.Errorf("partition: index of %s: %w", cat, err)
		}
		keys[cat] = ks
	}
	return buildUnits(s, keys), nil
}

func (a *Admin) withLanes(sources []string) []string {
	out := make([]string, 0, 2*len(sources))
	for _, s := range sources {
		out = append(out, s, s+":"+a.suffix)
	}
	return out
}

// status reads one unit's lease, halt, pending, lag and positions.
func (a *Admin) status(ctx context.Context, group string, u unit) (Status, error) {
	st := Status{Group: group, Unit: u.unit, Key: u.key, Sources: u.sources}
	if len(u.sources) > 0 {
		st.Category = u.label
	}
	fail := func(what string, err error) (Status, error) {
		return Status{}, fmt.Errorf("partition %s %s: %s: %w", group, u.unit, what, err)
	}
	var err error
	if st.Owner, st.Generation, err = a.lease(ctx, group, u.unit); err != nil {
		return fail("lease", err)
	}
	if st.Halt, err = a.halt(ctx, group, u.unit); err != nil {
		return fail("halt", err)
	}
	streams := u.sources
	if st.Halt != nil && !containsString(a.withLanes(streams), st.Halt.Stream) {
		streams = append(append([]string(nil), streams...), st.Halt.Stream)
	}
	for _, s := range a.withLanes(streams) {
		p, l, err := a.counts(ctx, group, s)
		if err != nil {
			return fail("stream "+s, err)
		}
		st.Pending += p
		st.Lag += l
	}
	if a.positions != nil {
		row, ok, err := a.positions.Get(ctx, group, u.unit)
		if err != nil {
			return fail("positions", err)
		}
		if ok {
			st.Positions = row.Positions
		}
	}
	return st, nil
}

func containsString(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// lease reads the unit's lease token as its owner and generation.
func (a *Admin) lease(ctx context.Context, group, unit string) (string, int64, error) {
	v, err := a.rdb.Get(ctx, a.key(LeaseKey(group, unit))).Result()
	if errors.Is(err, redis.Nil) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, err
	}
	owner, gen, _ := parseToken(v)
	return owner, gen, nil
}

// halt reads the unit's halt record; nil when it has none.
func (a *Admin) halt(ctx context.Context, group, unit string) (*Halt, error) {
	m, err := a.rdb.HGetAll(ctx, a.key(HaltKey(group, unit))).Result()
	if err != nil {
		return nil, err
	}
	if len(m) == 0 {
		return nil, nil
	}
	h := &Halt{Group: group, Unit: unit, Stream: m["stream"], Entry: m["entry"], MessageID: m["message_id"], Reason: m["reason"]}
	h.Attempts, _ = strconv.Atoi(m["attempts"])
	h.Generation, _ = strconv.ParseInt(m["generation"], 10, 64)
	h.Gap, _ = strconv.ParseInt(m["gap"], 10, 64)
	h.HaltedAt, _ = time.Parse(time.RFC3339Nano, m["halted_at"])
	return h, nil
}

// counts returns the group's pending entries and lag on stream.
func (a *Admin) counts(ctx context.Context, group, stream string) (pending, lag int64, err error) {
	return streamCounts(ctx, a.rdb, a.key(stream), group)
}

// streamCounts returns a group's pending entries and lag on the stream at
// key k. A missing stream counts nothing; a group not created yet has
// every entry to come.
func streamCounts(ctx context.Context, rdb redis.UniversalClient, k, group string) (pending, lag int64, err error) {
	b, err := readBacklog(ctx, rdb, k, group)
	return b.pending, b.lag, err
}

// backlog is what a group has not handled of one stream: entries
// delivered and not acked (pending), entries not delivered yet (lag), and
// the ID of the last one delivered ("" for a group not created yet).
type backlog struct {
	pending, lag int64
	delivered    string
}

func readBacklog(ctx context.Context, rdb redis.UniversalClient, k, group string) (backlog, error) {
	n, err := rdb.Exists(ctx, k).Result()
	if err != nil || n == 0 {
		return backlog{}, err
	}
	groups, err := rdb.XInfoGroups(ctx, k).Result()
	if err != nil {
		return backlog{}, err
	}
	for _, g := range groups {
		if g.Name != group {
			continue
		}
		lag := g.Lag
		if lag < 0 { // unknown after deletions: count what is past the group
			es, err := rdb.XRange(ctx, k, "("+g.LastDeliveredID, "+").Result()
			if err != nil {
				return backlog{}, err
			}
			lag = int64(len(es))
		}
		return backlog{pending: g.Pending, lag: lag, delivered: g.LastDeliveredID}, nil
	}
	lag, err := rdb.XLen(ctx, k).Result()
	return backlog{lag: lag}, err
}

// oldest returns when the oldest entry of b was added to the stream at k
// (from its ID, which the publish script lets Redis give: milliseconds of
// Redis's clock), the zero time if b holds none.
func (b backlog) oldest(ctx context.Context, rdb redis.UniversalClient, k, group string) (time.Time, error) {
	var id string
	switch {
	case b.pending > 0:
		p, err := rdb.XPending(ctx, k, group).Result()
		if err != nil {
			return time.Time{}, err
		}
		id = p.Lower
	case b.lag > 0:
		from := "-"
		if b.delivered != "" {
			from = "(" + b.delivered
		}
		es, err := rdb.XRangeN(ctx, k, from, "+", 1).Result()
		if err != nil || len(es) == 0 {
			return time.Time{}, err
		}
		id = es[0].ID
	default:
		return time.Time{}, nil
	}
	return entryTime(id)
}

// entryTime is when the stream entry id was added (its milliseconds part:
// Redis's clock).
func entryTime(id string) (time.Time, error) {
	ms, _, ok := strings.Cut(id, "-")
	t, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil {
		return time.Time{}, fmt.Errorf("stream entry ID %q is not <ms>-<seq>", id)
	}
	return time.UnixMilli(t), nil
}

// head lists the group's pending entries of stream, then the next ones not
// yet delivered, up to the inspect limit each.
func (a *Admin) head(ctx context.Context, group, unit, stream string, h *Halt) ([]HeadEntry, error) {
	k := a.key(stream)
	n, err := a.rdb.Exists(ctx, k).Result()
	if err != nil || n == 0 {
		return nil, err
	}
	groups, err := a.rdb.XInfoGroups(ctx, k).Result()
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", stream, err)
	}
	last := ""
	for _, g := range groups {
		if g.Name == group {
			last = g.LastDeliveredID
		}
	}
	var out []HeadEntry
	mark := func(e *HeadEntry) {
		e.Halted = h != nil && h.Stream == stream && h.Entry == e.ID
	}
	if last != "" {
		pend, err := a.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: k, Group: group, Start: "-", End: "+", Count: int64(a.limit)}).Result()
		if err != nil {
			return nil, fmt.Errorf("stream %s: pending: %w", stream, err)
		}
		for _, p := range pend {
			e := HeadEntry{Stream: stream, ID: p.ID, Pending: true, Consumer: p.Consumer, Deliveries: p.RetryCount}
			f, err := a.rdb.HGet(ctx, a.key(AttemptsKey(group, unit)), stream+"/"+p.ID).Int64()
			if err != nil && !errors.Is(err, redis.Nil) {
				return nil, fmt.Errorf("stream %s: entry %s: attempts: %w", stream, p.ID, err)
			}
			e.Failures = f
			msgs, err := a.rdb.XRange(ctx, k, p.ID, p.ID).Result()
			if err != nil {
				return nil, fmt.Errorf("stream %s: entry %s: %w", stream, p.ID, err)
			}
			if len(msgs) == 0 {
				e.Problem = "no longer in the stream"
			} else {
				a.describe(&e, msgs[0].Values)
			}
			mark(&e)
			out = append(out, e)
		}
	}
	from := "-"
	if last != "" {
		from = "(" + last
	}
	msgs, err := a.rdb.XRangeN(ctx, k, from, "+", int64(a.limit)).Result()
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", stream, err)
	}
	for _, m := range msgs {
		e := HeadEntry{Stream: stream, ID: m.ID}
		a.describe(&e, m.Values)
		mark(&e)
		out = append(out, e)
	}
	return out, nil
}

func (a *Admin) describe(e *HeadEntry, values map[string]any) {
	if a.decode == nil {
		e.MessageID, _ = values["id"].(string)
		e.Type, _ = values["type"].(string)
		return
	}
	m, err := a.decode(e.ID, values)
	if err != nil {
		e.Problem = err.Error()
		e.MessageID, _ = values["id"].(string)
		return
	}
	e.MessageID, e.Type, e.GlobalPosition = m.ID, m.Type, m.GlobalPosition
	e.Data = string(m.Data)
	if len(e.Data) > 200 {
		e.Data = e.Data[:200] + "…"
	}
}

// scanHalts finds every halt record under the prefix. A key is
// "{group}:{unit}:__halt__"; group names hold no colon, units do.
func (a *Admin) scanHalts(ctx context.Context) ([]unitID, error) {
	const suffix = ":__halt__"
	var out []unitID
	iter := a.rdb.Scan(ctx, 0, GlobEscape(a.prefix)+"*"+suffix, 1000).Iterator()
	for iter.Next(ctx) {
		k := strings.TrimSuffix(strings.TrimPrefix(iter.Val(), a.prefix), suffix)
		g, u, ok := strings.Cut(k, ":")
		if ok {
			out = append(out, unitID{g, u})
		}
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("partition: scan for halted units: %w", err)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].group != out[j].group {
			return out[i].group < out[j].group
		}
		return out[i].unit < out[j].unit
	})
	return out, nil
}

// HaltedGroups lists the groups in which unit is halted, for a caller that
// was given a unit but no group.
func (a *Admin) HaltedGroups(ctx context.Context, unit string) ([]string, error) {
	ids, err := a.scanHalts(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, id := range ids {
		if id.unit == unit {
			out = append(out, id.group)
		}
	}
	return out, nil
}

// GlobEscape escapes the glob characters of s, a key prefix, for a SCAN
// MATCH pattern.
func GlobEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Operator says who acts and why; both go to the audit record.
type Operator struct {
	By, Reason string
}

// Outcome is what an action did.
type Outcome struct {
	Action string // "skip", "dlq" or "resume"
	// Halt is the halt record acted on (and removed).
	Halt Halt
	// Acked is true when the head entry was pending and is acked now.
	Acked bool
	// DLQStream and DLQEntry name the dead letter written by dlq.
	DLQStream, DLQEntry string
	// AuditEntry is the record's id on AuditStream.
	AuditEntry string
	// Woken is true when the unit's key was announced on its category's
	// wake-up stream after the action (false: discovery finds it within
	// its walk of the index).
	Woken bool
}

// actionPrelude checks, inside the script, that the halt record is still
// the one the caller read. KEYS halt, stream, attempts, audit, accepted[,
// dlq]; ARGV stream, entry, group, unit, action, at, by, reason[, dlq
// stream, failed_at pair]. accept(gp) raises the stream's accepted
// position (AcceptedKey) to gp; headPosition is the head entry's global
// position (nil if the entry or the field is gone).
const actionPrelude = `
local h = redis.call('HMGET', KEYS[1], 'stream', 'entry', 'message_id', 'reason', 'attempts', 'gap')
if not h[1] then return redis.error_reply('NOTHALTED') end
if h[1] ~= ARGV[1] or h[2] ~= ARGV[2] then return redis.error_reply('CHANGED') end
local mid, reason, attempts, gap = h[3] or '', h[4] or '', h[5] or '0', tonumber(h[6] or '0') or 0
local function accept(gp)
  gp = tonumber(gp)
  if not gp or gp <= 0 then return end
  if gp > (tonumber(redis.call('HGET', KEYS[5], ARGV[1]) or '0') or 0) then redis.call('HSET', KEYS[5], ARGV[1], gp) end
end
local function headPosition()
  local e = redis.call('XRANGE', KEYS[2], ARGV[2], ARGV[2])[1]
  if not e or not e[2] then return nil end
  for i = 1, #e[2], 2 do if e[2][i] == 'global_position' then return e[2][i+1] end end
  return nil
end
local function finish(acked, extra, did)
  redis.call('HDEL', KEYS[3], ARGV[1] .. '/' .. ARGV[2])
  redis.call('DEL', KEYS[1])
  local audit = {'action', ARGV[5], 'group', ARGV[3], 'unit', ARGV[4], 'stream', ARGV[1], 'entry', ARGV[2],
    'message_id', mid, 'halt_reason', reason, 'attempts', attempts, 'at', ARGV[6], 'by', ARGV[7], 'reason', ARGV[8]}
  for _, v in ipairs(extra) do audit[#audit + 1] = v end
  return {acked, redis.call('XADD', KEYS[4], '*', unpack(audit)), did or ''}
end
`

// skipScript acks the head and clears the halt and its attempts, audited;
// the head's position is accepted, so the next message, whose prev it is,
// is not taken for one after a gap.
var skipScript = redis.NewScript(actionPrelude + `
accept(gap)
accept(headPosition())
return finish(redis.call('XACK', KEYS[2], ARGV[3], ARGV[2]), {})
`)

// resumeScript clears the halt and the head's attempts, audited; the head
// stays pending and is retried afresh by the next owner. A gap halt's gap
// is accepted: the head goes on past the messages its stream lacks.
var resumeScript = redis.NewScript(actionPrelude + `
accept(gap)
return finish(0, {})
`)

// dlqScript copies the head entry with dead-letter fields (redisstream's
// names, so its DLQ listing reads them) to the DLQ stream, then acks it and
// clears the halt, audited. A head gone from the stream is refused.
var dlqScript = redis.NewScript(actionPrelude + `
local e = redis.call('XRANGE', KEYS[2], ARGV[2], ARGV[2])[1]
if not e or not e[2] or #e[2] == 0 then return redis.error_reply('GONE') end
local args = {}
for _, v in ipairs(e[2]) do args[#args + 1] = v end
for _, v in ipairs({'dl_group', ARGV[3], 'dl_reason', reason, 'dl_attempts', attempts, 'dl_failed_at', ARGV[10],
  'dl_entry', ARGV[2], 'dl_stream', ARGV[1], 'dl_unit', ARGV[4]}) do args[#args + 1] = v end
local did = redis.call('XADD', KEYS[6], '*', unpack(args))
accept(gap)
accept(headPosition())
return finish(redis.call('XACK', KEYS[2], ARGV[3], ARGV[2]), {'dlq_stream', ARGV[9], 'dlq_entry', did}, did)
`)

// Skip acknowledges the halted head entry for the group, clears the halt
// and the entry's attempts, and appends an audit record, in one script.
// Positions are not touched (the next message has a higher global
// position); the head's position is accepted (AcceptedKey), so the next
// message, whose prev it is, is not halted as one after a gap.
func (a *Admin) Skip(ctx context.Context, group, unit string, op Operator) (Outcome, error) {
	return a.act(ctx, "skip", skipScript, group, unit, op)
}

// Resume clears the halt and the head's attempts, audited: the next owner
// retries the head with max_retries fresh attempts, and halts again if it
// still fails. A halt on a gap (ErrGap) is resumed past the messages its
// stream lacks: the gap is accepted (AcceptedKey) and the head applied.
func (a *Admin) Resume(ctx context.Context, group, unit string, op Operator) (Outcome, error) {
	return a.act(ctx, "resume", resumeScript, group, unit, op)
}

// DLQ moves the halted head entry to the partition's dead-letter stream
// "{category}:{key}:dlq" (its fields plus dl_group, dl_reason, dl_attempts,
// dl_failed_at, dl_entry, dl_stream, dl_unit), then acks it and clears the
// halt, audited, in one script. If the entry is gone from its stream it
// refuses with ErrEntryGone and changes nothing.
func (a *Admin) DLQ(ctx context.Context, group, unit string, op Operator) (Outcome, error) {
	return a.act(ctx, "dlq", dlqScript, group, unit, op)
}

func (a *Admin) act(ctx context.Context, action string, s *redis.Script, group, unit string, op Operator) (Outcome, error) {
	h, err := a.halt(ctx, group, unit)
	if err != nil {
		return Outcome{}, fmt.Errorf("partition %s %s: %s: %w", group, unit, action, err)
	}
	if h == nil {
		return Outcome{}, a.notHalted(ctx, group, unit)
	}
	keys := []string{a.key(HaltKey(group, unit)), a.key(h.Stream), a.key(AttemptsKey(group, unit)), a.key(AuditStream),
		a.key(AcceptedKey(group, unit))}
	args := []any{h.Stream, h.Entry, group, unit, action, a.now().UTC().Format(time.RFC3339Nano), op.By, op.Reason}
	out := Outcome{Action: action, Halt: *h}
	if action == "dlq" {
		out.DLQStream = h.Stream + ":" + partition.DLQToken
		keys = append(keys, a.key(out.DLQStream))
		at := h.HaltedAt
		if at.IsZero() {
			at = a.now()
		}
		args = append(args, out.DLQStream, fmt.Sprintf("%d %d", at.Unix(), at.Nanosecond()))
	}
	res, err := s.Run(ctx, a.rdb, keys, args...).Slice()
	switch {
	case err != nil && strings.Contains(err.Error(), "NOTHALTED"):
		return Outcome{}, a.notHalted(ctx, group, unit)
	case err != nil && strings.Contains(err.Error(), "CHANGED"):
		return Outcome{}, fmt.Errorf("partition %s %s: %s: %w", group, unit, action, ErrHaltChanged)
	case err != nil && strings.Contains(err.Error(), "GONE"):
		return Outcome{}, fmt.Errorf("partition %s %s: %s: entry %s of %s: %w", group, unit, action, h.Entry, h.Stream, ErrEntryGone)
	case err != nil:
		return Outcome{}, fmt.Errorf("partition %s %s: %s: %w", group, unit, action, err)
	case len(res) != 3:
		return Outcome{}, fmt.Errorf("partition %s %s: %s: unexpected reply %v", group, unit, action, res)
	}
	n, _ := res[0].(int64)
	out.Acked = n == 1
	out.AuditEntry, _ = res[1].(string)
	out.DLQEntry, _ = res[2].(string)
	out.Woken = a.wake(ctx, h.Stream) == nil
	return out, nil
}

// wake announces the key of a unit whose halt an action cleared on its
// category's wake-up stream, as a handover announces released keys: a
// host with room acquires it at once, instead of at its discovery's walk
// over the key.
func (a *Admin) wake(ctx context.Context, stream string) error {
	cat, key, err := partition.ParseUnit(stream, a.suffix)
	if err != nil {
		return err
	}
	return (&Leases{rdb: a.rdb, prefix: a.prefix}).Released(ctx, cat, []string{key})
}

// notHalted builds the StateError naming what the unit is instead.
func (a *Admin) notHalted(ctx context.Context, group, unit string) error {
	owner, gen, err := a.lease(ctx, group, unit)
	if err != nil {
		return fmt.Errorf("partition %s %s: lease: %w", group, unit, err)
	}
	state := "not halted"
	if owner != "" {
		state = fmt.Sprintf("owned by %s at generation %d", owner, gen)
	}
	return &StateError{Group: group, Unit: unit, State: state}
}
