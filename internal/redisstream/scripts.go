package redisstream

import "github.com/redis/go-redis/v9"

// The Lua scripts. Each runs atomically on the server, so a group's state
// (the consumer group plus the hash and sorted sets beside it) changes in
// one step even with many host instances sharing the group. The "#!lua"
// shebang (Redis 7) makes the server refuse a script up front when it is out
// of memory, instead of failing it half way: together with the type checks
// in publish, a script writes all or nothing.
//
// Times are passed and stored as "seconds nanoseconds": Lua numbers are
// doubles and cannot hold a Unix time in nanoseconds exactly, and the
// injected clock (broker.Options.Now) is compared to the nanosecond.

// publishScript appends every message of a Publish call. KEYS come in
// fours per message: stream, id index, partition index, wake-up stream
// (the stream key again for the last two when the message has no
// partition key; they are not touched then);
// with Options.Epoch, the epoch marker follows them and the last ARGV is
// the epoch the caller read before it claimed what it publishes (or ""):
// a Redis without the marker (restarted empty, or a replica promoted
// without it), or with another epoch than the caller's, refuses the whole
// call with NOEPOCH before writing anything. The marker is
// "{epoch}@{run_id}", the server's run_id when it was set: a server that
// restarted since (a new run_id) refuses with RESTARTED, since its last
// acknowledged writes may be gone (appendfsync everysec, a failover). ARGV per message: message id,
// partition key or "", field count, fields. It returns the entry ids, ""
// for a message dropped as a duplicate. Last, each wake-up stream gets one
// entry naming the distinct partition keys the call published to (as
// field names), so the partition consumers blocked on it start on those
// keys at once (package partition, WakeKey); it keeps about the last
// ARGV-given number of entries (wakeMaxLen).
var publishScript = redis.NewScript(`#!lua
local want = {'stream', 'hash', 'set', 'stream'}
local n = math.floor(#KEYS / 4)
if #KEYS % 4 == 1 then
  local mark, want = redis.call('GET', KEYS[#KEYS]), ARGV[#ARGV]
  if not mark then
    return redis.error_reply('NOEPOCH the epoch marker ' .. KEYS[#KEYS] .. ' is missing: this Redis lost its data')
  end
  if want ~= '' then
    local run = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
    if mark ~= want .. '@' .. run then
      if mark == want or string.sub(mark, 1, #want + 1) == want .. '@' then
        return redis.error_reply('RESTARTED this Redis restarted since epoch ' .. want .. ' was set: what it acknowledged last may be lost')
      end
      return redis.error_reply('NOEPOCH the epoch is ' .. mark .. ', not ' .. want .. ': this Redis lost its data since')
    end
  end
end
local wake_len = ARGV[1]
local a = 2
local msgs = {}
for i = 1, n do
  local id, pkey, nf = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  local fields = {}
  for j = 1, nf do fields[j] = ARGV[a + 2 + j] end
  a = a + 3 + nf
  msgs[i] = {id = id, pkey = pkey, fields = fields}
  for k = 1, 4 do
    if k < 3 or pkey ~= '' then
      local key = KEYS[(i - 1) * 4 + k]
      local t = redis.call('TYPE', key)['ok']
      if t ~= 'none' and t ~= want[k] then
        return redis.error_reply('WRONGTYPE key ' .. key .. ' holds a ' .. t .. ', want a ' .. want[k])
      end
    end
  end
end
local out = {}
local wakes, woken = {}, {}
for i = 1, n do
  local m = msgs[i]
  local b = (i - 1) * 4
  local s, ids, idx, wake = KEYS[b + 1], KEYS[b + 2], KEYS[b + 3], KEYS[b + 4]
  if redis.call('HEXISTS', ids, m.id) == 1 then
    out[i] = ''
  else
    local eid = redis.call('XADD', s, '*', unpack(m.fields))
    redis.call('HSET', ids, m.id, eid)
    out[i] = eid
  end
  if m.pkey ~= '' then
    redis.call('SADD', idx, m.pkey)
    local w = wakes[wake]
    if not w then
      w = {}
      wakes[wake], woken[wake] = w, {}
    end
    if not woken[wake][m.pkey] then
      woken[wake][m.pkey] = true
      w[#w + 1] = m.pkey
      w[#w + 1] = '1'
    end
  end
end
for wake, w in pairs(wakes) do
  redis.call('XADD', wake, 'MAXLEN', '~', wake_len, '*', unpack(w))
end
return out
`)

// groupPrelude is shared by the scripts of an ordinary consumer group.
// KEYS: 1 stream, 2 group state hash, 3 requeued (sorted set, lexical by
// padded entry id), 4 in flight (sorted set, score = delivery second),
// 5 dead-letter stream, 6 id index, 7 wake stream.
// ARGV: 1 group, 2 consumer, 3-4 now, 5-6 the MessageTimeout cutoff
// (now - timeout), 7 "1" to dead-letter or "0" to discard.
//
// The state hash holds, per entry id E: a:E deliveries so far, t:E when
// the current delivery went out, q:E when a requeued entry is due, x:E
// "dead <dlq entry id>" or "discarded", r:E the fields of a replayed dead
// letter (MessagePack); per message id M of a dead letter, d:M its entry
// id; and n:dead, the DLQ count.
//
// Trimming (package partition's Trim) removes entries every group has
// acked, and their id index fields. A dead letter is acked (XACK when it
// is dead-lettered), so its entry and index field may be trimmed while it
// waits in the DLQ: d:M keeps its message id reachable for Replay, Ack and
// Nack, and Replay copies its fields from the DLQ entry into r:E, from
// which Next delivers it when the stream entry is gone. Both go when the
// replayed message is acked or given up on again.
const groupPrelude = `#!lua
local S, H, Q, F, D, I, W = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local G, C = ARGV[1], ARGV[2]
local now_s, now_n = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = ARGV[3] .. ' ' .. ARGV[4]
local cut_s, cut_n = tonumber(ARGV[5]), tonumber(ARGV[6])
local DLQ = ARGV[7] == '1'
local killed = {}

local function tpair(v)
  local s, n = string.match(v or '', '^(%-?%d+) (%d+)$')
  return tonumber(s), tonumber(n)
end
local function before(as, an, bs, bn) return as < bs or (as == bs and an < bn) end
-- pad makes entry ids compare as strings in numeric order.
local function pad(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  return string.rep('0', 20 - #ms) .. ms .. '-' .. string.rep('0', 20 - #seq) .. seq
end
local function field(fields, name)
  for i = 1, #fields, 2 do if fields[i] == name then return fields[i + 1] end end
  return ''
end
-- entry_of returns the entry id of message id: from the id index, or for a
-- dead letter whose entry was trimmed, from d:id.
local function entry_of(id)
  return redis.call('HGET', I, id) or redis.call('HGET', H, 'd:' .. id)
end
-- fields_of returns an entry's fields: from the stream, or for a replayed
-- dead letter whose entry was trimmed, from r:eid; nil if neither has it.
local function fields_of(eid)
  local e = redis.call('XRANGE', S, eid, eid)[1]
  if e then return e[2], true end
  local r = redis.call('HGET', H, 'r:' .. eid)
  if r then return cmsgpack.unpack(r), false end
  return nil, false
end

-- kill dead-letters an entry (XADD to the DLQ stream, then XACK, in this
-- one script: nothing is lost between them) or discards it.
local function kill(eid, reason, attempts)
  local fields = fields_of(eid) or {}
  local mid = field(fields, 'id')
  redis.call('XACK', S, G, eid)
  redis.call('ZREM', F, eid)
  redis.call('HDEL', H, 'a:' .. eid, 't:' .. eid, 'r:' .. eid)
  if DLQ then
    local args = {}
    for _, v in ipairs(fields) do args[#args + 1] = v end
    for _, v in ipairs({'dl_group', G, 'dl_reason', reason, 'dl_attempts', attempts, 'dl_failed_at', now, 'dl_entry', eid}) do
      args[#args + 1] = v
    end
    local did = redis.call('XADD', D, '*', unpack(args))
    redis.call('HSET', H, 'x:' .. eid, 'dead ' .. did)
    if mid ~= '' then redis.call('HSET', H, 'd:' .. mid, eid) end
    redis.call('HINCRBY', H, 'n:dead', 1)
  else
    redis.call('HSET', H, 'x:' .. eid, 'discarded')
    if mid ~= '' then redis.call('HDEL', H, 'd:' .. mid) end
  end
  killed[#killed + 1] = mid
  killed[#killed + 1] = reason
  killed[#killed + 1] = attempts
end

-- expire dead-letters the entries in flight since before the cutoff.
local function expire()
  for _, eid in ipairs(redis.call('ZRANGEBYSCORE', F, '-inf', cut_s)) do
    local s, n = tpair(redis.call('HGET', H, 't:' .. eid))
    if not s or before(s, n, cut_s, cut_n) then
      kill(eid, 'timeout', tonumber(redis.call('HGET', H, 'a:' .. eid) or '1'))
    end
  end
end

-- delivered returns the entry id of message id if the group has read it.
local function delivered(id)
  local eid = entry_of(id)
  if not eid or redis.call('EXISTS', S) == 0 then return nil end
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', S)) do
    local name, last
    for i = 1, #g, 2 do
      if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then last = g[i + 1] end
    end
    if name == G then
      if pad(eid) <= pad(last) then return eid end
      return nil
    end
  end
  return nil
end

local function wake() redis.call('XADD', W, 'MAXLEN', 1, '*', 'n', '1') end
`

// nextScript delivers the group's next message: the head of the requeued
// line if it is due (if it is not, nothing: it holds the line), else a new
// entry (XREADGROUP COUNT 1). Replies {"msg", killed, entry id, fields,
// attempt}, {"held", killed, due} or {"empty", killed, last stream id, last
// wake id}.
var nextScript = redis.NewScript(groupPrelude + `
expire()
while true do
  local m = redis.call('ZRANGE', Q, 0, 0)[1]
  if not m then break end
  local eid = string.match(m, ' (.+)$')
  local due = redis.call('HGET', H, 'q:' .. eid)
  local rs, rn = tpair(due)
  if rs and before(now_s, now_n, rs, rn) then return {'held', killed, due} end
  redis.call('ZREM', Q, m)
  redis.call('HDEL', H, 'q:' .. eid)
  local fields, in_stream = fields_of(eid)
  if fields then
    -- Keep XPENDING honest about who holds it (a no-op for a replayed
    -- entry, which left the pending list when it was dead-lettered).
    if in_stream then redis.call('XCLAIM', S, G, C, 0, eid, 'JUSTID') end
    local a = redis.call('HINCRBY', H, 'a:' .. eid, 1)
    redis.call('HSET', H, 't:' .. eid, now)
    redis.call('ZADD', F, now_s, eid)
    return {'msg', killed, eid, fields, a}
  end
  redis.call('HDEL', H, 'a:' .. eid) -- trimmed away: nothing to deliver
end
local r = redis.call('XREADGROUP', 'GROUP', G, C, 'COUNT', 1, 'STREAMS', S, '>')
if r then
  local e = r[1][2][1]
  redis.call('HSET', H, 'a:' .. e[1], 1, 't:' .. e[1], now)
  redis.call('ZADD', F, now_s, e[1])
  return {'msg', killed, e[1], e[2], 1}
end
local last = redis.call('XREVRANGE', S, '+', '-', 'COUNT', 1)[1]
local lw = redis.call('XREVRANGE', W, '+', '-', 'COUNT', 1)[1]
return {'empty', killed, last and last[1] or '0-0', lw and lw[1] or '0-0'}
`)

// ackScript: ARGV[8] message id. Replies {status, killed, detail}.
var ackScript = redis.NewScript(groupPrelude + `
expire()
-- The common case first: in flight means delivered, without XINFO.
local eid = entry_of(ARGV[8])
if not (eid and redis.call('ZSCORE', F, eid)) then eid = delivered(ARGV[8]) end
if not eid then return {'not_delivered', killed} end
if redis.call('ZSCORE', F, eid) then
  redis.call('XACK', S, G, eid)
  redis.call('ZREM', F, eid)
  redis.call('HDEL', H, 'a:' .. eid, 't:' .. eid, 'r:' .. eid, 'd:' .. ARGV[8])
  return {'ok', killed}
end
if redis.call('HEXISTS', H, 'q:' .. eid) == 1 then return {'not_in_flight', killed, 'nacked, awaiting redelivery'} end
local x = redis.call('HGET', H, 'x:' .. eid)
if x then
  if string.sub(x, 1, 5) == 'dead ' then return {'not_in_flight', killed, 'dead-lettered'} end
  return {'not_in_flight', killed, 'discarded'}
end
return {'ok', killed}
`)

// nackScript: ARGV[8] message id, 9 MaxRetries (-1: Reject, no retry
// left), 10 Delay in nanoseconds, 11 the backoff factor
// (delivery.BackoffFactor), 12 MaxDelay in nanoseconds (0: no cap), 13 the jitter factor drawn by
// the client, 14 the dead letter's reason past the retries.
var nackScript = redis.NewScript(groupPrelude + `
expire()
local eid = entry_of(ARGV[8])
if not (eid and redis.call('ZSCORE', F, eid)) then eid = delivered(ARGV[8]) end
if not eid then return {'not_delivered', killed} end
if not redis.call('ZSCORE', F, eid) then
  if redis.call('HEXISTS', H, 'q:' .. eid) == 1 or redis.call('HEXISTS', H, 'x:' .. eid) == 1 then
    return {'ok', killed} -- nacked before, or given up on
  end
  return {'acked', killed}
end
local a = tonumber(redis.call('HGET', H, 'a:' .. eid) or '1')
if a > tonumber(ARGV[9]) then
  kill(eid, ARGV[14], a)
  return {'ok', killed}
end
redis.call('ZREM', F, eid)
redis.call('HDEL', H, 't:' .. eid)
-- Delay * factor^(a-1), saturating and capped like delivery.Policy.Pause,
-- then the client's jitter.
local d, mult, max = tonumber(ARGV[10]), tonumber(ARGV[11]), 9.2e18
if tonumber(ARGV[12]) > 0 then max = tonumber(ARGV[12]) end
for i = 2, a do
  if d >= max then break end
  d = d * mult
end
if d > max then d = max end
d = math.floor(d * tonumber(ARGV[13]))
local ds = math.floor(d / 1e9)
local rs, rn = now_s + ds, now_n + math.floor(d - ds * 1e9)
if rn >= 1e9 then rs, rn = rs + 1, rn - 1e9 end
redis.call('HSET', H, 'q:' .. eid, string.format('%d %d', rs, rn))
redis.call('ZADD', Q, 0, pad(eid) .. ' ' .. eid)
wake()
return {'ok', killed}
`)

// replayScript: ARGV[8] message id. Moves a dead letter back to the head
// of the line, due now, attempts reset.
var replayScript = redis.NewScript(groupPrelude + `
expire()
local eid = entry_of(ARGV[8])
local x = eid and redis.call('HGET', H, 'x:' .. eid)
if not x or string.sub(x, 1, 5) ~= 'dead ' then return {'not_dead', killed} end
-- Keep the message's fields (the DLQ copy's, less the dl_ ones): the
-- stream entry is acked by this group and may be trimmed before the
-- replayed message is delivered.
local did = string.sub(x, 6)
local de = redis.call('XRANGE', D, did, did)[1]
if de then
  local keep = {}
  for i = 1, #de[2], 2 do
    if string.sub(de[2][i], 1, 3) ~= 'dl_' then
      keep[#keep + 1] = de[2][i]
      keep[#keep + 1] = de[2][i + 1]
    end
  end
  redis.call('HSET', H, 'r:' .. eid, cmsgpack.pack(keep))
end
redis.call('XDEL', D, did)
redis.call('HDEL', H, 'x:' .. eid)
redis.call('HINCRBY', H, 'n:dead', -1)
redis.call('HSET', H, 'a:' .. eid, 0, 'q:' .. eid, now)
redis.call('ZADD', Q, 0, pad(eid) .. ' ' .. eid)
wake()
return {'ok', killed}
`)

// dlqScript lists the dead-letter stream's entries (the caller keeps the
// group's): {"ok", killed, entries}.
var dlqScript = redis.NewScript(groupPrelude + `
expire()
return {'ok', killed, redis.call('XRANGE', D, '-', '+')}
`)

// statsScript: {"ok", killed, depth, requeued, in flight, dead letters}.
var statsScript = redis.NewScript(groupPrelude + `
expire()
if redis.call('EXISTS', S) == 0 then return {'ok', killed, 0, 0, 0, 0} end
local found, lag, last = false, nil, nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', S)) do
  local name, l, ld
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1]
    elseif g[i] == 'lag' then l = g[i + 1]
    elseif g[i] == 'last-delivered-id' then ld = g[i + 1] end
  end
  if name == G then found, lag, last = true, l, ld end
end
if not found then
  -- A group's first read starts at the stream's first entry.
  return {'ok', killed, redis.call('XLEN', S), 0, 0, 0}
end
if not lag then -- unknown after deletions: count what is left past the group
  lag = #redis.call('XRANGE', S, '(' .. last, '+')
end
local rq = redis.call('ZCARD', Q)
return {'ok', killed, lag + rq, rq, redis.call('ZCARD', F), tonumber(redis.call('HGET', H, 'n:dead') or '0')}
`)

// batchScript is nextScript for up to ARGV[8] messages, in the order
// nextScript would deliver them: due heads of the requeued line, then new
// entries (one XREADGROUP COUNT n, without BLOCK). A redelivery (an entry
// with deliveries so far, a:E > 0) is delivered alone: the batch stops
// before it, and after it. A released entry (a:E given back by
// releaseScript) is not a redelivery. Replies {"batch", killed, {{entry
// id, fields, attempt}...}}, or nextScript's "held" and "empty" replies
// when it delivers nothing.
var batchScript = redis.NewScript(groupPrelude + `
expire()
local limit = tonumber(ARGV[8])
local out = {}
while #out < limit do
  local m = redis.call('ZRANGE', Q, 0, 0)[1]
  if not m then break end
  local eid = string.match(m, ' (.+)$')
  local due = redis.call('HGET', H, 'q:' .. eid)
  local rs, rn = tpair(due)
  if rs and before(now_s, now_n, rs, rn) then
    if #out == 0 then return {'held', killed, due} end
    return {'batch', killed, out}
  end
  if #out > 0 and tonumber(redis.call('HGET', H, 'a:' .. eid) or '0') > 0 then
    return {'batch', killed, out} -- a redelivery runs alone
  end
  redis.call('ZREM', Q, m)
  redis.call('HDEL', H, 'q:' .. eid)
  local fields, in_stream = fields_of(eid)
  if fields then
    if in_stream then redis.call('XCLAIM', S, G, C, 0, eid, 'JUSTID') end
    local a = redis.call('HINCRBY', H, 'a:' .. eid, 1)
    redis.call('HSET', H, 't:' .. eid, now)
    redis.call('ZADD', F, now_s, eid)
    out[#out + 1] = {eid, fields, a}
    if a > 1 then return {'batch', killed, out} end
  else
    redis.call('HDEL', H, 'a:' .. eid) -- trimmed away: nothing to deliver
  end
end
if #out < limit then -- the requeued line is empty
  local r = redis.call('XREADGROUP', 'GROUP', G, C, 'COUNT', limit - #out, 'STREAMS', S, '>')
  if r then
    for _, e in ipairs(r[1][2]) do
      redis.call('HSET', H, 'a:' .. e[1], 1, 't:' .. e[1], now)
      redis.call('ZADD', F, now_s, e[1])
      out[#out + 1] = {e[1], e[2], 1}
    end
  end
end
if #out > 0 then return {'batch', killed, out} end
local last = redis.call('XREVRANGE', S, '+', '-', 'COUNT', 1)[1]
local lw = redis.call('XREVRANGE', W, '+', '-', 'COUNT', 1)[1]
return {'empty', killed, last and last[1] or '0-0', lw and lw[1] or '0-0'}
`)

// releaseScript: ARGV[8] message id, or with ARGV[9] "1" an entry id (a
// malformed entry has no message id). Gives an in-flight entry back
// untried: into the requeued line at its place (entry order, so behind an
// earlier entry awaiting its retry), due now, with its delivery count
// taken back by one, so its next delivery has the same attempt. Like
// nackScript, it is "ok" for an entry requeued or given up on, "acked"
// for one acked.
var releaseScript = redis.NewScript(groupPrelude + `
expire()
local eid = ARGV[8]
if ARGV[9] ~= '1' then
  eid = entry_of(ARGV[8])
  if not (eid and redis.call('ZSCORE', F, eid)) then eid = delivered(ARGV[8]) end
  if not eid then return {'not_delivered', killed} end
end
if not redis.call('ZSCORE', F, eid) then
  if redis.call('HEXISTS', H, 'q:' .. eid) == 1 or redis.call('HEXISTS', H, 'x:' .. eid) == 1 then
    return {'ok', killed}
  end
  return {'acked', killed}
end
redis.call('ZREM', F, eid)
redis.call('HDEL', H, 't:' .. eid)
redis.call('HINCRBY', H, 'a:' .. eid, -1)
redis.call('HSET', H, 'q:' .. eid, now)
redis.call('ZADD', Q, 0, pad(eid) .. ' ' .. eid)
wake()
return {'ok', killed}
`)

// sweepScript: KEYS stream; ARGV group, own consumer name, idle bound in
// milliseconds. Deletes every other consumer of the group with no pending
// entries that has been idle longer than the bound, and returns {name,
// idle ms, ...} of those it deleted. A missing stream or group has none.
var sweepScript = redis.NewScript(`#!lua
local out = {}
local cs = redis.pcall('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if type(cs) == 'table' and cs.err then
  if string.find(cs.err, 'NOGROUP', 1, true) or string.find(cs.err, 'no such key', 1, true) then return out end
  return redis.error_reply(cs.err)
end
local bound = tonumber(ARGV[3])
for _, c in ipairs(cs) do
  local name, pending, idle
  for i = 1, #c, 2 do
    if c[i] == 'name' then name = c[i + 1]
    elseif c[i] == 'pending' then pending = c[i + 1]
    elseif c[i] == 'idle' then idle = c[i + 1] end
  end
  -- pending == 0: DELCONSUMER drops the consumer's pending entries.
  if name and name ~= ARGV[2] and pending == 0 and idle and idle > bound then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
    out[#out + 1] = name
    out[#out + 1] = idle
  end
end
return out
`)

// epochScript reads the epoch marker beside the server's run_id: KEYS
// marker. It returns {marker or "", run_id}.
var epochScript = redis.NewScript(`#!lua
local mark = redis.call('GET', KEYS[1]) or ''
return {mark, string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')}
`)

// setEpochScript sets the marker to "{ARGV[1]}@{run_id}": KEYS marker.
var setEpochScript = redis.NewScript(`#!lua
redis.call('SET', KEYS[1], ARGV[1] .. '@' .. string.match(redis.call('INFO', 'server'), 'run_id:(%w+)'))
return 1
`)
