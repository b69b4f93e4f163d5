package redispartition

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Errors of the lease protocol. Calls wrap them with the group and unit;
// test with errors.Is.
var (
	// ErrLeaseLost: the caller's lease expired or another owner holds the
	// unit now. Every fenced call refuses a stale token with it; the owner
	// must stop working on the unit at once.
	ErrLeaseLost = errors.New("partition lease lost")
	// ErrLeaseHeld: Acquire found the unit leased by another owner.
	ErrLeaseHeld = errors.New("partition lease held by another owner")
	// ErrHalted: Acquire found the unit halted on a poison message; it stays
	// unowned until an operator resumes, skips or dead-letters the head.
	ErrHalted = errors.New("partition halted")
)

// Lease is one owner's hold on a unit, at one generation.
type Lease struct {
	Group, Unit string
	Owner       string
	// Generation is the Redis fencing generation: one more than the last
	// acquirer's, never reused.
	Generation int64
}

// Token is the fence token "{owner}:{generation}", also the owner's Redis
// consumer name, so each generation has its own pending entries list.
// acquireScript writes the same in Lua; parseToken reads it back.
func (l Lease) Token() string { return l.Owner + ":" + strconv.FormatInt(l.Generation, 10) }

// parseToken splits a lease token "{owner}:{generation}" at its last
// colon: an owner may hold colons (package owner's names do), a
// generation never does. ok is false when the token has no colon or its
// generation is not a number; owner is then still what precedes the last
// colon (the whole token without one), for the callers that only name the
// holder.
func parseToken(token string) (owner string, generation int64, ok bool) {
	i := strings.LastIndexByte(token, ':')
	if i < 0 {
		return token, 0, false
	}
	gen, err := strconv.ParseInt(token[i+1:], 10, 64)
	return token[:i], gen, err == nil
}

// Entry is a stream entry as a fenced read returns it.
type Entry struct {
	ID     string
	Values map[string]any
}

// Leases runs the lease protocol on one Redis: every step that must be
// atomic with the lease check is one Lua script.
type Leases struct {
	rdb    redis.UniversalClient
	prefix string
	// loaded is set once the pipelined scripts were loaded (see
	// pipelineScripts); loading holds loadMu, so the workers that start
	// together load them once, not once each.
	loaded atomic.Bool
	loadMu sync.Mutex
}

// NewLeases returns the protocol over rdb, with every key prefixed by
// prefix (empty in production: keys are exactly the DESIGN names).
func NewLeases(rdb redis.UniversalClient, prefix string) *Leases {
	return &Leases{rdb: rdb, prefix: prefix}
}

func (s *Leases) key(k string) string { return s.prefix + k }

// The liveness of a lease is its owner's: a lease key has no TTL, and
// holds while its owner heartbeats in the hosts set (HostsKey, one
// command per heartbeat however many leases it holds). Once an owner's
// heartbeat has lapsed, another host may take its leases over: it reads
// the lease's token, sees the token's owner missing from a hosts set it
// read after the token, and replaces exactly that token (a compare and
// set, so two successors cannot both win). Every fenced step checks the
// token as before, so an owner that was only stalled is refused from its
// first step after the takeover, as it was when a lease key expired.

// heartbeatScript: KEYS hosts, then the members sets of the groups the
// owner consumes (ARGV[3] of them), then those of the groups it left;
// ARGV owner, ttl_ms, the count of groups consumed. Registers the owner
// until now + ttl (the server's clock) in the hosts set and in each
// consumed group's set, drops the lapsed from them, removes the owner from
// the sets of the groups it left, and returns {1 if the owner had lapsed
// (or was new), {each consumed group's live member count}, the live
// owners...}.
var heartbeatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local till = now + tonumber(ARGV[2])
local prev = redis.call('ZSCORE', KEYS[1], ARGV[1])
local lapsed = 0
if not prev or tonumber(prev) < now then lapsed = 1 end
local counts = {}
local n = tonumber(ARGV[3])
for i = 1, n + 1 do
  redis.call('ZADD', KEYS[i], till, ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', '(' .. now)
  if i > 1 then counts[#counts + 1] = redis.call('ZCARD', KEYS[i]) end
end
for i = n + 2, #KEYS do redis.call('ZREM', KEYS[i], ARGV[1]) end
local out = {lapsed, counts}
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do out[#out + 1] = m end
return out
`)

// liveScript: KEYS hosts. The owners whose heartbeat has not lapsed.
var liveScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf')
`)

// Beat is what one heartbeat learned.
type Beat struct {
	// Live are the owners whose heartbeat has not lapsed (the caller
	// among them).
	Live map[string]bool
	// Lapsed reports that the caller was not live before this heartbeat
	// (its first, or one after a stall or an outage longer than the TTL):
	// its leases may have been taken over meanwhile.
	Lapsed bool
	// Members counts, per group the caller consumes, the live owners
	// that consume it (the caller among them): the group's fair share is
	// its units over this count.
	Members map[string]int
}

// Heartbeat registers owner as live for ttl from now, as a consumer of
// each of groups (MembersKey) and no longer of each of left, and returns
// what it learned.
func (s *Leases) Heartbeat(ctx context.Context, owner string, ttl time.Duration, groups, left []string) (Beat, error) {
	keys := make([]string, 0, 1+len(groups)+len(left))
	keys = append(keys, s.key(HostsKey))
	for _, g := range groups {
		keys = append(keys, s.key(MembersKey(g)))
	}
	for _, g := range left {
		keys = append(keys, s.key(MembersKey(g)))
	}
	res, err := heartbeatScript.Run(ctx, s.rdb, keys, owner, ttl.Milliseconds(), len(groups)).Slice()
	if err != nil {
		return Beat{}, fmt.Errorf("partition: heartbeat of %s: %w", owner, err)
	}
	if len(res) < 2 {
		return Beat{}, fmt.Errorf("partition: heartbeat of %s: short reply %v", owner, res)
	}
	n, _ := res[0].(int64)
	counts, _ := res[1].([]any)
	if len(counts) != len(groups) {
		return Beat{}, fmt.Errorf("partition: heartbeat of %s: %d member counts for %d groups", owner, len(counts), len(groups))
	}
	b := Beat{Live: make(map[string]bool, len(res)-2), Lapsed: n == 1, Members: make(map[string]int, len(groups))}
	for i, g := range groups {
		c, _ := counts[i].(int64)
		b.Members[g] = int(c)
	}
	for _, m := range res[2:] {
		if name, ok := m.(string); ok {
			b.Live[name] = true
		}
	}
	return b, nil
}

// Live returns the owners whose heartbeat has not lapsed.
func (s *Leases) Live(ctx context.Context) (map[string]bool, error) {
	res, err := liveScript.Run(ctx, s.rdb, []string{s.key(HostsKey)}).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("partition: live hosts: %w", err)
	}
	live := make(map[string]bool, len(res))
	for _, m := range res {
		live[m] = true
	}
	return live, nil
}

// Leave removes owner from the hosts set and from the members sets of
// groups (a host that stops, after releasing its leases).
func (s *Leases) Leave(ctx context.Context, owner string, groups []string) error {
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, s.key(HostsKey), owner)
		for _, g := range groups {
			p.ZRem(ctx, s.key(MembersKey(g)), owner)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("partition: leave %s: %w", owner, err)
	}
	return nil
}

// acquireScript: KEYS lease, generation, halt of each unit (in threes);
// ARGV owner, the most units to take (-1: no limit), then per unit a token
// the caller found lapsed ("" for none). Per unit: -2 halted; the new
// generation when the lease was free, or held by exactly that lapsed
// token (and has no TTL: a lease of an older host, which expires by
// itself, is left to expire), while the limit allows; -3 when it would
// have been taken but the limit was reached; else the holder's token.
var acquireScript = redis.NewScript(`
local out = {}
local left = tonumber(ARGV[2])
for i = 1, #KEYS, 3 do
  local lapsed = ARGV[(i - 1) / 3 + 3]
  local cur = redis.call('GET', KEYS[i])
  if redis.call('EXISTS', KEYS[i + 2]) == 1 then
    out[#out + 1] = -2
  elseif cur and (lapsed == '' or cur ~= lapsed or redis.call('PTTL', KEYS[i]) ~= -1) then
    out[#out + 1] = cur
  elseif left == 0 then
    out[#out + 1] = -3
  else
    local gen = redis.call('INCR', KEYS[i + 1])
    redis.call('SET', KEYS[i], ARGV[1] .. ':' .. gen)
    out[#out + 1] = gen
    if left > 0 then left = left - 1 end
  end
end
return out
`)

// leaseChunk is the most units one acquire or check script handles: a
// pass over 100,000 units is a few hundred scripts, none of which holds
// the server for long.
const leaseChunk = 500

// Unit names a unit of a consumer group, for the bulk calls.
type Unit struct{ Group, Unit string }

// Want is one unit of AcquireAll: Lapsed, if set, is the token of a
// holder the caller found lapsed (see Heartbeat), which may be replaced.
type Want struct {
	Unit
	Lapsed string
}

// Acquired is the outcome of one unit of AcquireAll: a lease, or an error
// wrapping ErrLeaseHeld (Holder is then the holder's token), ErrHalted, or
// ErrOverLimit (the unit was free, but the call's limit was reached).
type Acquired struct {
	Lease  Lease
	Holder string
	Err    error
}

// ErrOverLimit: AcquireAll found the unit free (or its holder lapsed) but
// had already taken as many units as its limit allows.
var ErrOverLimit = errors.New("partition lease not taken: the acquire limit was reached")

// Acquire takes the unit's lease at the next generation while it is
// free, or answers owner's lease if owner holds it already (the call is
// safe to send again after a lost reply). It fails with ErrLeaseHeld when another owner holds it and
// ErrHalted when the unit is halted. The lease holds while owner
// heartbeats (Heartbeat).
func (s *Leases) Acquire(ctx context.Context, group, unit, owner string) (Lease, error) {
	got, err := s.AcquireAll(ctx, []Want{{Unit: Unit{group, unit}}}, owner, -1)
	if err != nil {
		return Lease{}, err
	}
	return got[0].Lease, got[0].Err
}

// AcquireAll is Acquire of many units, leaseChunk of them per script, each
// also taken over from its Lapsed holder, taking at most limit of them
// (limit < 0: no limit): one outcome per unit, in order. The error is the
// servers' (a chunk that failed); the outcomes before it are kept and
// returned with it.
func (s *Leases) AcquireAll(ctx context.Context, wants []Want, owner string, limit int) ([]Acquired, error) {
	out := make([]Acquired, 0, len(wants))
	if limit < 0 {
		limit = -1
	}
	for from := 0; from < len(wants); from += leaseChunk {
		chunk := wants[from:min(from+leaseChunk, len(wants))]
		keys := make([]string, 0, 3*len(chunk))
		args := make([]any, 0, 2+len(chunk))
		args = append(args, owner, limit)
		for _, w := range chunk {
			keys = append(keys, s.key(LeaseKey(w.Group, w.Unit.Unit)), s.key(GenerationKey(w.Group, w.Unit.Unit)), s.key(HaltKey(w.Group, w.Unit.Unit)))
			args = append(args, w.Lapsed)
		}
		res, err := acquireScript.Run(ctx, s.rdb, keys, args...).Slice()
		if err == nil && len(res) != len(chunk) {
			err = fmt.Errorf("unexpected reply of %d for %d units", len(res), len(chunk))
		}
		if err != nil {
			return out, fmt.Errorf("partition: acquire %d units (first %s %s): %w", len(chunk), chunk[0].Group, chunk[0].Unit.Unit, err)
		}
		for i, w := range chunk {
			g, u := w.Group, w.Unit.Unit
			switch r := res[i].(type) {
			case string:
				if held, gen, ok := parseToken(r); ok && held == owner {
					// Ours already: an earlier run of this call took it
					// and its reply was lost (the client sent it again).
					out = append(out, Acquired{Lease: Lease{Group: g, Unit: u, Owner: owner, Generation: gen}})
					if limit > 0 {
						limit--
					}
					continue
				}
				out = append(out, Acquired{Holder: r, Err: fmt.Errorf("partition %s %s: held by %s: %w", g, u, r, ErrLeaseHeld)})
			case int64:
				switch {
				case r == -2:
					out = append(out, Acquired{Err: fmt.Errorf("partition %s %s: %w", g, u, ErrHalted)})
				case r == -3:
					out = append(out, Acquired{Err: fmt.Errorf("partition %s %s: %w", g, u, ErrOverLimit)})
				default:
					out = append(out, Acquired{Lease: Lease{Group: g, Unit: u, Owner: owner, Generation: r}})
					if limit > 0 {
						limit--
					}
				}
			default:
				return out, fmt.Errorf("partition %s %s: acquire: unexpected reply %v", g, u, r)
			}
		}
	}
	return out, nil
}

// checkScript: KEYS the leases; ARGV each lease's token. Per lease 1 if
// it is still the token's, 0 if not.
var checkScript = redis.NewScript(`
local out = {}
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[i] then out[i] = 1 else out[i] = 0 end
end
return out
`)

// Check reports whether the lease is still the caller's (ErrLeaseLost if
// not).
func (s *Leases) Check(ctx context.Context, l Lease) error {
	lost, err := s.CheckAll(ctx, []Lease{l})
	if err != nil {
		return fmt.Errorf("partition %s %s: check: %w", l.Group, l.Unit, err)
	}
	if len(lost) > 0 {
		return s.fenced(l, "check", 0, nil)
	}
	return nil
}

// CheckAll returns the indexes of the leases that are no longer the
// caller's (taken over after its heartbeat lapsed, or released),
// leaseChunk of them per script. On a server error the chunks not checked
// are not reported.
func (s *Leases) CheckAll(ctx context.Context, leases []Lease) (lost []int, err error) {
	for from := 0; from < len(leases); from += leaseChunk {
		chunk := leases[from:min(from+leaseChunk, len(leases))]
		keys := make([]string, 0, len(chunk))
		args := make([]any, 0, len(chunk))
		for _, l := range chunk {
			keys = append(keys, s.key(LeaseKey(l.Group, l.Unit)))
			args = append(args, l.Token())
		}
		res, err := checkScript.Run(ctx, s.rdb, keys, args...).Int64Slice()
		if err == nil && len(res) != len(chunk) {
			err = fmt.Errorf("unexpected reply of %d for %d leases", len(res), len(chunk))
		}
		if err != nil {
			return lost, fmt.Errorf("partition: check %d leases: %w", len(chunk), err)
		}
		for i, n := range res {
			if n == 0 {
				lost = append(lost, from+i)
			}
		}
	}
	return lost, nil
}

// releaseScript: KEYS lease; ARGV token.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
`)

// Release gives the lease up so a successor can take over at once. It
// fails with ErrLeaseLost when the lease was no longer the caller's.
func (s *Leases) Release(ctx context.Context, l Lease) error {
	n, err := releaseScript.Run(ctx, s.rdb, []string{s.key(LeaseKey(l.Group, l.Unit))}, l.Token()).Int64()
	return s.fenced(l, "release", n, err)
}

// fenced turns a script's 0/1 answer into nil or ErrLeaseLost.
func (s *Leases) fenced(l Lease, op string, n int64, err error) error {
	if err != nil {
		if isFenced(err) {
			return fmt.Errorf("partition %s %s: %s at generation %d: %w", l.Group, l.Unit, op, l.Generation, ErrLeaseLost)
		}
		return fmt.Errorf("partition %s %s: %s: %w", l.Group, l.Unit, op, err)
	}
	if n == 0 {
		return fmt.Errorf("partition %s %s: %s at generation %d: %w", l.Group, l.Unit, op, l.Generation, ErrLeaseLost)
	}
	return nil
}

func isFenced(err error) bool {
	return err != nil && strings.Contains(err.Error(), "FENCED")
}

// ensureGroup is the Lua that creates the consumer group of a stream from
// its first entry when it does not exist (NOGROUP), then retries the call.
// A group created at 0 reads the whole stream: a new handler sees every
// message still in its partitions.
const ensureGroup = `
local function call_group(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    if string.find(r.err, 'NOGROUP', 1, true) then
      redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[2], '0', 'MKSTREAM')
      return redis.call(...)
    end
    return redis.error_reply(r.err)
  end
  return r
end
`

// readScript: KEYS lease, stream; ARGV token, group, count, id ('0' for
// the owner's pending entries, '>' for new ones). A '>' read returns the
// owner's pending entries instead while it has any: a read whose reply
// was lost (a timeout, a cut connection) delivered entries the owner never
// saw, and a client that sends the script again (go-redis retries a
// command whose reply it did not get) must get those first, not the ones
// after them.
//
// It answers the ids of the entries it delivered, not the entries: Redis
// turns a script's reply into Lua values and back, which cost about four
// times the XREADGROUP itself for 64 entries of a few hundred bytes; the
// caller reads the bodies with a plain XRANGE (see fetch). An entry is
// immutable, so reading it outside the script reads what the script
// delivered.
var readScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED') end
` + ensureGroup + `
local id = ARGV[4]
if id == '>' then
  local p = call_group('XPENDING', KEYS[2], ARGV[2], '-', '+', 1, ARGV[1])
  if type(p) == 'table' and p.err then return p end
  if #p > 0 then id = '0' end
end
local r = call_group('XREADGROUP', 'GROUP', ARGV[2], ARGV[1], 'COUNT', ARGV[3], 'STREAMS', KEYS[2], id)
if type(r) == 'table' and r.err then return r end
local ids = {}
if r and r[1] then
  for _, e in ipairs(r[1][2]) do ids[#ids + 1] = e[1] end
end
return ids
`)

// Read is a fenced XREADGROUP of up to count entries of stream as the
// lease's consumer: its own pending entries (retries and reclaimed ones)
// when pending, new entries otherwise, unless it has pending ones (see
// readScript): the same call sent twice never skips entries. It never
// blocks.
func (s *Leases) Read(ctx context.Context, l Lease, stream string, pending bool, count int) ([]Entry, error) {
	return s.ReadAfter(ctx, l, stream, pending, count, "")
}

// ReadAfter is Read with a guess at where the entries it delivers begin:
// after, the last entry the caller was delivered on stream ("" for the
// stream's start). The bodies are read by an XRANGE from there, sent with
// the fenced read in one round trip; a wrong guess costs one more round
// trip, never a wrong entry (fetch). Acks, if any, go first in the same
// round trip, each a fenced Ack (so the read, which answers the caller's
// pending entries first, does not answer them again): a worker's acks
// ride with its next read (ConsumerOptions.AckDelay).
func (s *Leases) ReadAfter(ctx context.Context, l Lease, stream string, pending bool, count int, after string, acks ...Acks) ([]Entry, error) {
	id := ">"
	if pending {
		id = "0"
	}
	var read *redis.Cmd
	var bodies *redis.XMessageSliceCmd
	scripts := []*redis.Script{readScript}
	if len(acks) > 0 {
		scripts = append(scripts, ackScript)
	}
	cmds := s.pipelineScripts(ctx, scripts, func(p redis.Pipeliner) []*redis.Cmd {
		out := s.queueAcks(ctx, p, l, acks)
		read = readScript.EvalSha(ctx, p, []string{s.key(LeaseKey(l.Group, l.Unit)), s.key(stream)}, l.Token(), l.Group, count, id)
		bodies = p.XRangeN(ctx, s.key(stream), rangeAfter(after), "+", int64(count))
		return append(out, read)
	})
	if err := s.ackErr(l, acks, cmds); err != nil {
		return nil, err
	}
	ids, err := cmds[len(acks)].StringSlice()
	if err != nil {
		return nil, s.fenced(l, "read "+stream, 1, err)
	}
	return s.fetch(ctx, stream, ids, bodies)
}

// Acks are entries of one stream to ack: entries the caller applied.
type Acks struct {
	Stream string
	IDs    []string
}

// AckAll acks each of acks (a fenced Ack per stream) in one round trip.
func (s *Leases) AckAll(ctx context.Context, l Lease, acks []Acks) error {
	if len(acks) == 0 {
		return nil
	}
	cmds := s.pipelineScripts(ctx, []*redis.Script{ackScript}, func(p redis.Pipeliner) []*redis.Cmd {
		return s.queueAcks(ctx, p, l, acks)
	})
	return s.ackErr(l, acks, cmds)
}

// queueAcks queues a fenced ack script per element of acks on p.
func (s *Leases) queueAcks(ctx context.Context, p redis.Pipeliner, l Lease, acks []Acks) []*redis.Cmd {
	out := make([]*redis.Cmd, 0, len(acks)+1)
	for _, a := range acks {
		keys, args := s.ackArgs(l, a.Stream, a.IDs)
		out = append(out, ackScript.EvalSha(ctx, p, keys, args...))
	}
	return out
}

// ackErr is the first failure among the ack commands that lead cmds.
func (s *Leases) ackErr(l Lease, acks []Acks, cmds []*redis.Cmd) error {
	for i, a := range acks {
		if err := cmds[i].Err(); err != nil {
			return s.fenced(l, "ack "+a.Stream, 1, err)
		}
	}
	return nil
}

// rangeAfter is XRANGE's exclusive start after id ("-": the stream's start).
func rangeAfter(id string) string {
	if id == "" {
		return "-"
	}
	return "(" + id
}

// fetch pairs the ids a fenced read delivered with their bodies: from
// guess (an XRANGE sent with the read) when it holds them, else by one
// XRANGE per id left, pipelined. An id that no XRANGE finds was deleted
// while pending (XREADGROUP answers such an entry with no fields): it
// comes back with nil Values, and the caller acks it.
func (s *Leases) fetch(ctx context.Context, stream string, ids []string, guess *redis.XMessageSliceCmd) ([]Entry, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	out := make([]Entry, len(ids))
	var got []redis.XMessage
	if guess != nil {
		got, _ = guess.Result() // a failed guess is only a miss
	}
	var miss []int
	j := 0
	for i, id := range ids {
		out[i].ID = id
		for j < len(got) && entryLess(got[j].ID, id) {
			j++
		}
		if j < len(got) && got[j].ID == id {
			out[i].Values = got[j].Values
			j++
			continue
		}
		miss = append(miss, i)
	}
	if len(miss) == 0 {
		return out, nil
	}
	one := make([]*redis.XMessageSliceCmd, len(miss))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, i := range miss {
			one[k] = p.XRange(ctx, s.key(stream), ids[i], ids[i])
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("partition: read bodies of %s: %w", stream, err)
	}
	for k, i := range miss {
		if ms := one[k].Val(); len(ms) == 1 && ms[0].ID == ids[i] {
			out[i].Values = ms[0].Values
		}
	}
	return out, nil
}

// entryLess orders stream entry ids "ms-seq" numerically.
func entryLess(a, b string) bool {
	am, as, _ := strings.Cut(a, "-")
	bm, bs, _ := strings.Cut(b, "-")
	if len(am) != len(bm) {
		return len(am) < len(bm)
	}
	if am != bm {
		return am < bm
	}
	if len(as) != len(bs) {
		return len(as) < len(bs)
	}
	return as < bs
}

// reclaimScript: KEYS lease, stream; ARGV token, group, cursor, count.
// One XAUTOCLAIM step moving any consumer's pending entries to the token's
// consumer; returns the next cursor.
var reclaimScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED') end
` + ensureGroup + `
local r = call_group('XAUTOCLAIM', KEYS[2], ARGV[2], ARGV[1], 0, ARGV[3], 'COUNT', ARGV[4], 'JUSTID')
return {r[1], #r[2]}
`)

// Reclaim moves every pending entry of the group on stream (a previous
// owner's) to the lease's consumer, fenced at every step: an owner that
// lost its lease between acquiring and reclaiming must not steal its
// successor's pending entries, or the successor would read past them. It
// returns how many entries it moved.
func (s *Leases) Reclaim(ctx context.Context, l Lease, stream string) (int, error) {
	cursor, moved := "0-0", 0
	for {
		res, err := reclaimScript.Run(ctx, s.rdb, []string{s.key(LeaseKey(l.Group, l.Unit)), s.key(stream)},
			l.Token(), l.Group, cursor, 100).Slice()
		if err != nil {
			return moved, s.fenced(l, "reclaim "+stream, 1, err)
		}
		if len(res) != 2 {
			return moved, fmt.Errorf("partition: unexpected XAUTOCLAIM reply %v", res)
		}
		cursor, _ = res[0].(string)
		n, _ := res[1].(int64)
		moved += int(n)
		if cursor == "0-0" || cursor == "" {
			return moved, nil
		}
	}
}

// dropStaleScript: KEYS lease, stream; ARGV token, group. Deletes every
// other consumer of the group on stream that has no pending entries;
// returns their names.
var dropStaleScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED') end
local out = {}
local cs = redis.pcall('XINFO', 'CONSUMERS', KEYS[2], ARGV[2])
if type(cs) == 'table' and cs.err then
  if string.find(cs.err, 'NOGROUP', 1, true) or string.find(cs.err, 'no such key', 1, true) then return out end
  return redis.error_reply(cs.err)
end
for _, c in ipairs(cs) do
  local name, pending
  for i = 1, #c, 2 do
    if c[i] == 'name' then name = c[i + 1] elseif c[i] == 'pending' then pending = c[i + 1] end
  end
  -- pending == 0: DELCONSUMER drops the consumer's pending entries.
  if name and name ~= ARGV[1] and pending == 0 then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[2], ARGV[2], name)
    out[#out + 1] = name
  end
end
return out
`)

// DropStale deletes the consumers of the lease's group on stream that are
// not the lease's own and have no pending entries, and returns their
// names. The consumer name is the token, so every lease generation adds a
// consumer to the group; after Reclaim has moved every pending entry to
// the lease's consumer, the earlier generations' consumers are empty
// clutter. They are dead by the fence itself (each of their reads, claims
// and acks would fail with ErrLeaseLost), so no idle time is needed to
// judge them, unlike package redisstream's ordinary groups. A consumer
// that still has pending entries is kept: XGROUP DELCONSUMER would drop
// them, and the trim's hold on their entries with them. Fenced like every
// step: a stale owner deletes nothing.
func (s *Leases) DropStale(ctx context.Context, l Lease, stream string) ([]string, error) {
	res, err := dropStaleScript.Run(ctx, s.rdb, []string{s.key(LeaseKey(l.Group, l.Unit)), s.key(stream)}, l.Token(), l.Group).StringSlice()
	if err != nil {
		return nil, s.fenced(l, "drop stale consumers of "+stream, 1, err)
	}
	return res, nil
}

// ackScript: KEYS lease, stream, attempts; ARGV token, group, attempts
// field prefix, ids...
var ackScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED') end
-- One XACK and one HDEL per 1,000 ids (unpack's stack bound is ~8,000).
local n = 0
for from = 4, #ARGV, 1000 do
  local ids, fields = {}, {}
  for i = from, math.min(from + 999, #ARGV) do
    ids[#ids + 1] = ARGV[i]
    fields[#fields + 1] = ARGV[3] .. ARGV[i]
  end
  n = n + redis.call('XACK', KEYS[2], ARGV[2], unpack(ids))
  redis.call('HDEL', KEYS[3], unpack(fields))
end
return n
`)

// Ack is a fenced XACK of ids on stream; it also forgets their failed
// attempts. It returns how many were pending.
func (s *Leases) Ack(ctx context.Context, l Lease, stream string, ids ...string) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	keys, args := s.ackArgs(l, stream, ids)
	n, err := ackScript.Run(ctx, s.rdb, keys, args...).Int64()
	if err != nil {
		return 0, s.fenced(l, "ack "+stream, 1, err)
	}
	return int(n), nil
}

// ackArgs are ackScript's keys and arguments for ids of stream.
func (s *Leases) ackArgs(l Lease, stream string, ids []string) ([]string, []any) {
	args := make([]any, 0, 3+len(ids))
	args = append(args, l.Token(), l.Group, stream+"/")
	for _, id := range ids {
		args = append(args, id)
	}
	return []string{s.key(LeaseKey(l.Group, l.Unit)), s.key(stream), s.key(AttemptsKey(l.Group, l.Unit))}, args
}

// attemptScript: KEYS lease, attempts; ARGV token, field.
var attemptScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED') end
return redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
`)

// Attempt records a failed attempt at entry id of stream and returns how
// many there have been, across owners: the count lives in Redis, so a
// failover does not reset it.
func (s *Leases) Attempt(ctx context.Context, l Lease, stream, id string) (int, error) {
	n, err := attemptScript.Run(ctx, s.rdb, []string{s.key(LeaseKey(l.Group, l.Unit)), s.key(AttemptsKey(l.Group, l.Unit))},
		l.Token(), stream+"/"+id).Int64()
	if err != nil {
		return 0, s.fenced(l, "attempt "+stream, 1, err)
	}
	return int(n), nil
}

// Halt is a unit's durable halt record: the poison message at its head.
type Halt struct {
	Group, Unit string
	Stream      string
	Entry       string
	MessageID   string
	Reason      string
	Attempts    int
	HaltedAt    time.Time
	// Generation is the lease generation that halted the unit.
	Generation int64
	// Gap is set when the unit halted because its stream lacks messages
	// before the head: the head's prev, the global position the missing
	// messages end at. Resume lets the unit go on past them.
	Gap int64
}

// haltScript: KEYS lease, halt; ARGV token, field/value pairs.
var haltScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED') end
redis.call('DEL', KEYS[2])
for i = 2, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i+1]) end
redis.call('DEL', KEYS[1])
return 1
`)

// Halt records h durably and releases the lease, in one step: from then on
// no instance acquires the unit until an operator acts on it.
func (s *Leases) Halt(ctx context.Context, l Lease, h Halt) error {
	reason := h.Reason
	if len(reason) > 2000 {
		reason = reason[:2000] + "…"
	}
	_, err := haltScript.Run(ctx, s.rdb, []string{s.key(LeaseKey(l.Group, l.Unit)), s.key(HaltKey(l.Group, l.Unit))},
		l.Token(), "stream", h.Stream, "entry", h.Entry, "message_id", h.MessageID, "reason", reason,
		"attempts", h.Attempts, "halted_at", h.HaltedAt.UTC().Format(time.RFC3339Nano), "generation", l.Generation, "gap", h.Gap).Result()
	if err != nil {
		return s.fenced(l, "halt", 1, err)
	}
	return nil
}

// reapScript: KEYS lease, index, streams..., their id indexes...; ARGV
// token, key, min_idle_ms, number of streams. Removes the key from the
// index and deletes its streams, with the broker's id index of each
// (IDIndexKey: publish dedupe, which would otherwise outlive its stream),
// only when each stream is empty, or idle for min_idle_ms with every group
// caught up and nothing pending. The generation counter is kept.
var reapScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return redis.error_reply('FENCED') end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local ns = tonumber(ARGV[4])
for i = 3, 2 + ns do
  local last = redis.call('XREVRANGE', KEYS[i], '+', '-', 'COUNT', 1)
  if #last > 0 then
    local id = last[1][1]
    local ms = tonumber(string.match(id, '^(%d+)-'))
    if now_ms - ms < tonumber(ARGV[3]) then return 0 end
    local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[i])
    if not ok or #groups == 0 then return 0 end
    for _, g in ipairs(groups) do
      local info = {}
      for j = 1, #g, 2 do info[g[j]] = g[j+1] end
      if tonumber(info['pending']) > 0 then return 0 end
      local ld = info['last-delivered-id']
      local a1, a2 = string.match(ld, '^(%d+)-(%d+)$')
      local b1, b2 = string.match(id, '^(%d+)-(%d+)$')
      a1, a2, b1, b2 = tonumber(a1), tonumber(a2), tonumber(b1), tonumber(b2)
      if a1 < b1 or (a1 == b1 and a2 < b2) then return 0 end
    end
  end
end
redis.call('SREM', KEYS[2], ARGV[2])
for i = 3, #KEYS do redis.call('DEL', KEYS[i]) end
return 1
`)

// Reap retires an idle partition key of category: if every one of its
// streams is empty, or idle for minIdle with every consumer group caught up
// and nothing pending, the key leaves the index and its streams (with their
// id indexes) are deleted, in one step fenced by the caller's lease. A publish re-creates
// both atomically (the publish script does XADD and SADD together), so a
// reap never strands a message.
func (s *Leases) Reap(ctx context.Context, l Lease, category, key string, streams []string, minIdle time.Duration) (bool, error) {
	keys := []string{s.key(LeaseKey(l.Group, l.Unit)), s.key(IndexKey(category))}
	for _, st := range streams {
		keys = append(keys, s.key(st))
	}
	for _, st := range streams {
		keys = append(keys, s.key(IDIndexKey(st)))
	}
	n, err := reapScript.Run(ctx, s.rdb, keys, l.Token(), key, minIdle.Milliseconds(), len(streams)).Int64()
	if err != nil {
		return false, s.fenced(l, "reap", 1, err)
	}
	return n == 1, nil
}

// Accepted is the global position up to which an operator let the unit go
// on without what stream lacks (AcceptedKey), 0 if none.
func (s *Leases) Accepted(ctx context.Context, l Lease, stream string) (int64, error) {
	n, err := s.rdb.HGet(ctx, s.key(AcceptedKey(l.Group, l.Unit)), stream).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("partition %s %s: accepted of %s: %w", l.Group, l.Unit, stream, err)
	}
	return n, nil
}

// Members lists the live keys of category's partition index.
func (s *Leases) Members(ctx context.Context, category string) ([]string, error) {
	keys, err := s.rdb.SMembers(ctx, s.key(IndexKey(category))).Result()
	if err != nil {
		return nil, fmt.Errorf("partition: index of %s: %w", category, err)
	}
	return keys, nil
}

// A worker's first step on a unit is one round trip: Take (reclaim, drop
// stale consumers, first read), a pipeline of the fenced scripts above,
// each of which checks the token itself, so a pipeline is only fewer
// round trips, never a weaker fence: a stale token is refused by every
// script in it. Every script in them is safe to run twice (see Lost
// replies in docs/partitions.md), so a pipeline that go-redis sends again,
// or that runs again after Redis lacked a script, is too.

// pipelineScripts sends steps in one pipeline by EVALSHA; if Redis lacks
// one of the scripts (a restart, SCRIPT FLUSH: the steps that needed it
// did not run, those after it may have), it loads them and sends the
// pipeline again. The scripts are loaded before the first pipeline too,
// so that a first call does not run its steps twice. The caller reads
// each step's outcome from its command.
func (s *Leases) pipelineScripts(ctx context.Context, scripts []*redis.Script, steps func(p redis.Pipeliner) []*redis.Cmd) []*redis.Cmd {
	if !s.loaded.Load() {
		s.loadMu.Lock()
		if !s.loaded.Load() {
			ok := true
			for _, sc := range pipelined {
				ok = ok && sc.Load(ctx, s.rdb).Err() == nil
			}
			s.loaded.Store(ok)
		}
		s.loadMu.Unlock()
	}
	for try := 0; ; try++ {
		var cmds []*redis.Cmd
		_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			cmds = steps(p)
			return nil
		})
		noscript := false
		for _, c := range cmds {
			noscript = noscript || redis.HasErrorPrefix(c.Err(), "NOSCRIPT")
		}
		if try > 0 || !noscript {
			return cmds
		}
		for _, sc := range scripts {
			if err := sc.Load(ctx, s.rdb).Err(); err != nil {
				return cmds
			}
		}
	}
}

// pipelined are the scripts sent in pipelines.
var pipelined = []*redis.Script{reclaimScript, dropStaleScript, readScript, ackScript}

// Taken is what Take found on a stream.
type Taken struct {
	// Moved counts the pending entries the reclaim moved to the lease's
	// consumer; Dropped names the stale consumers it deleted.
	Moved   int
	Dropped []string
	// Entries is the first read, valid only when Complete: the reclaim
	// moved every pending entry. It is the lease's own pending entries
	// when Moved > 0, new entries otherwise (readScript).
	Entries  []Entry
	Complete bool
}

// Take is a new owner's first step on stream, in one round trip: one
// reclaim step (Reclaim), DropStale, and a Read of up to count entries,
// each fenced by the lease. When the reclaim needed more than one step
// (more than 100 pending entries), Take finishes it with Reclaim and
// DropStale and returns no entries (Complete false... set to true after
// that, with Entries empty): entries the pipelined read delivered are
// pending in the lease's consumer, and the next read answers them first.
func (s *Leases) Take(ctx context.Context, l Lease, stream string, count int) (Taken, error) {
	lease, st := s.key(LeaseKey(l.Group, l.Unit)), s.key(stream)
	tok := l.Token()
	var bodies *redis.XMessageSliceCmd
	cmds := s.pipelineScripts(ctx, []*redis.Script{reclaimScript, dropStaleScript, readScript}, func(p redis.Pipeliner) []*redis.Cmd {
		cmds := []*redis.Cmd{
			reclaimScript.EvalSha(ctx, p, []string{lease, st}, tok, l.Group, "0-0", 100),
			dropStaleScript.EvalSha(ctx, p, []string{lease, st}, tok, l.Group),
			readScript.EvalSha(ctx, p, []string{lease, st}, tok, l.Group, count, ">"),
		}
		// A guess at the bodies: the stream's first entries, which they
		// are once trimmed, or for a new group.
		bodies = p.XRangeN(ctx, st, "-", "+", int64(count))
		return cmds
	})
	var t Taken
	res, err := cmds[0].Slice()
	if err != nil {
		return Taken{}, s.fenced(l, "reclaim "+stream, 1, err)
	}
	if len(res) != 2 {
		return Taken{}, fmt.Errorf("partition: unexpected XAUTOCLAIM reply %v", res)
	}
	cursor, _ := res[0].(string)
	n, _ := res[1].(int64)
	t.Moved = int(n)
	if t.Dropped, err = cmds[1].StringSlice(); err != nil {
		return Taken{}, s.fenced(l, "drop stale consumers of "+stream, 1, err)
	}
	ids, err := cmds[2].StringSlice()
	if err != nil {
		return Taken{}, s.fenced(l, "read "+stream, 1, err)
	}
	if cursor != "0-0" && cursor != "" {
		// Reclaim starts over at 0-0: the step above moved what it
		// scanned, so the scan finds the rest.
		more, err := s.Reclaim(ctx, l, stream)
		t.Moved += more
		if err != nil {
			return t, err
		}
		dropped, err := s.DropStale(ctx, l, stream)
		t.Dropped = append(t.Dropped, dropped...)
		return t, err
	}
	t.Complete = true
	if t.Entries, err = s.fetch(ctx, stream, ids, bodies); err != nil {
		return Taken{}, err
	}
	return t, nil
}

// Count returns how many live keys each of categories' indexes holds, in
// order (SCARD), and the id of the last entry of each one's wake-up
// stream at that moment ("0-0" if none), in one transaction: the size of
// a group's index without reading it, and which wake-ups it includes (a
// publish adds to the index and the wake-up stream in one script).
func (s *Leases) Count(ctx context.Context, categories []string) ([]int, []string, error) {
	cards := make([]*redis.IntCmd, len(categories))
	tails := make([]*redis.XMessageSliceCmd, len(categories))
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for i, cat := range categories {
			cards[i] = p.SCard(ctx, s.key(IndexKey(cat)))
			tails[i] = p.XRevRangeN(ctx, s.key(WakeKey(cat)), "+", "-", 1)
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("partition: count the indexes of %v: %w", categories, err)
	}
	counts, at := make([]int, len(categories)), make([]string, len(categories))
	for i := range categories {
		counts[i], at[i] = int(cards[i].Val()), "0-0"
		if last := tails[i].Val(); len(last) > 0 {
			at[i] = last[0].ID
		}
	}
	return counts, at, nil
}

// Scan reads one page of category's index from cursor (SSCAN, about count
// keys): the keys and the cursor to go on from, 0 once the walk has
// covered the index. A key that stays in the index for a whole walk is
// returned at least once (maybe twice); one added or removed meanwhile
// may or may not be.
func (s *Leases) Scan(ctx context.Context, category string, cursor uint64, count int) ([]string, uint64, error) {
	keys, next, err := s.rdb.SScan(ctx, s.key(IndexKey(category)), cursor, "", int64(count)).Result()
	if err != nil {
		return nil, 0, fmt.Errorf("partition: scan the index of %s: %w", category, err)
	}
	return keys, next, nil
}

// Holding reports, for each of keys, whether category's index holds it
// (SMISMEMBER).
func (s *Leases) Holding(ctx context.Context, category string, keys []string) ([]bool, error) {
	args := make([]any, len(keys))
	for i, k := range keys {
		args[i] = k
	}
	in, err := s.rdb.SMIsMember(ctx, s.key(IndexKey(category)), args...).Result()
	if err != nil {
		return nil, fmt.Errorf("partition: look up %d keys in the index of %s: %w", len(keys), category, err)
	}
	return in, nil
}

// Dedicated returns the protocol over a client of its own with a pool of
// size connections, and its closer: a host's heartbeat and discovery go
// through it, so they do not queue behind thousands of workers' commands
// in the shared pool (a host that had just acquired 10,000 partitions took
// seconds to heartbeat, and as long to hand any over). Over a client that
// is not a *redis.Client (a cluster client) it returns s itself.
func (s *Leases) Dedicated(size int) (*Leases, func() error) {
	cl, ok := s.rdb.(*redis.Client)
	if !ok {
		return s, func() error { return nil }
	}
	o := *cl.Options()
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns = size, 0, size
	o.PushNotificationProcessor = nil // the client's own: NewClient makes one
	// The client's own too, and written by it under a lock of its own as
	// its connections negotiate (initConn): NewClient's copy of it read
	// the shared one unlocked, a data race (-race in CI). nil gives the
	// new client the default, as a parsed URL does.
	o.MaintNotificationsConfig = nil
	d := redis.NewClient(&o)
	return &Leases{rdb: d, prefix: s.prefix}, d.Close
}
