package redispartition

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// IDIndexKey is the broker's publish dedupe index of stream
// "{stream}:__ids__" (a hash: message id -> entry id, see package
// internal/redisstream). It holds one field per entry still in the stream:
// Trim removes the fields of the entries it removes, and Reap deletes it
// with its stream.
func IDIndexKey(stream string) string { return stream + ":__ids__" }

// entryIDField is the entry field holding the message id (the codec's
// redisstream.FieldID; that package imports this one, so the name is
// repeated here and a test of redisstream pins that the two agree).
const entryIDField = "id"

// trimBatch bounds the entries one trim script removes, so a stream with a
// long acked prefix never blocks Redis for long: Trim loops instead.
const trimBatch = 1000

// trimScript: KEYS stream, id index; ARGV batch. Removes the entries below
// the stream's safe point (at most batch of them) and their id index
// fields; returns how many entries it removed.
//
// The safe point is the minimum over the stream's consumer groups of the
// group's lowest pending entry id when it has pending entries, else its
// last-delivered-id. Every entry strictly below it was delivered to every
// group (it is at or below each last-delivered-id) and is pending in none,
// so every group acked it (or, for a group created at "$" or moved with
// SETID, never wanted it). A stream without a group is left alone: nobody
// has said what it still needs. XINFO GROUPS, XPENDING and XTRIM run in one
// script, so no read or ack can slip between the computation and the trim.
var trimScript = redis.NewScript(`#!lua
local S, I = KEYS[1], KEYS[2]
local batch = tonumber(ARGV[1])
if redis.call('TYPE', S)['ok'] ~= 'stream' then return 0 end
local groups = redis.call('XINFO', 'GROUPS', S)
if #groups == 0 then return 0 end
-- pad makes entry ids compare as strings in numeric order.
local function pad(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  return string.rep('0', 20 - #ms) .. ms .. '-' .. string.rep('0', 20 - #seq) .. seq
end
local safe
for _, g in ipairs(groups) do
  local info = {}
  for j = 1, #g, 2 do info[g[j]] = g[j + 1] end
  local need = info['last-delivered-id']
  if tonumber(info['pending']) > 0 then
    need = redis.call('XPENDING', S, info['name'])[2]
  end
  if not safe or pad(need) < pad(safe) then safe = need end
end
if safe == '0-0' then return 0 end
local below = redis.call('XRANGE', S, '-', '(' .. safe, 'COUNT', batch + 1)
if #below == 0 then return 0 end
local cut, n = safe, #below
if n > batch then cut, n = below[batch + 1][1], batch end
local ids = {}
for i = 1, n do
  local f = below[i][2]
  for j = 1, #f, 2 do
    if f[j] == '` + entryIDField + `' then ids[#ids + 1] = f[j + 1]; break end
  end
  if #ids >= 500 then redis.call('HDEL', I, unpack(ids)); ids = {} end
end
if #ids > 0 then redis.call('HDEL', I, unpack(ids)) end
return redis.call('XTRIM', S, 'MINID', cut)
`)

// Trim removes the entries of stream that every existing consumer group has
// acked (see trimScript for the safe point), with their fields in the
// broker's id index, and returns how many it removed. A stream without a
// group is not trimmed. Retention is therefore "until every existing group
// acked it": a group created after a trim starts at the entries that are
// left.
//
// Trim is not fenced by a lease: it only removes what every group has
// acked, and an ack is final (nothing reads an acked entry again, and a
// fenced reclaim moves pending entries only), so a stale or lease-less
// caller cannot remove anything an owner still needs. It runs one script
// per trimBatch entries, so each step is short.
func (s *Leases) Trim(ctx context.Context, stream string) (int64, error) {
	var total int64
	for {
		n, err := trimScript.Run(ctx, s.rdb, []string{s.key(stream), s.key(IDIndexKey(stream))}, trimBatch).Int64()
		if err != nil {
			return total, fmt.Errorf("partition: trim %s: %w", stream, err)
		}
		total += n
		if n < trimBatch {
			return total, nil
		}
	}
}
