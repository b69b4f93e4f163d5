package redisstream_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/internal/redisstream"
)

// reap models the partition reaper: it trims a key's stream (as if every
// entry had been consumed) and then, if the stream is empty, removes the
// key from the index and deletes the stream, in one step.
var reap = redis.NewScript(`
redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)
if redis.call('XLEN', KEYS[1]) == 0 then
  redis.call('SREM', KEYS[2], ARGV[1])
  redis.call('DEL', KEYS[1])
end
return 0
`)

// unindexed atomically lists the keys whose stream has entries while the
// index lacks them: what a reaper or a discovery would miss.
var unindexed = redis.NewScript(`
local out = {}
for i = 2, #KEYS do
  if redis.call('XLEN', KEYS[i]) > 0 and redis.call('SISMEMBER', KEYS[1], ARGV[i - 1]) == 0 then
    out[#out + 1] = ARGV[i - 1]
  end
end
return out
`)

// TestPublishReapRace publishes partitioned messages while a reaper empties
// and unindexes streams and a checker takes atomic snapshots: no snapshot
// may show a stream with entries whose key is not indexed. Publishing the
// XADD and the SADD as two steps fails it.
func TestPublishReapRace(t *testing.T) {
	t.Parallel()
	c, prefix := client(t)
	b, err := redisstream.New(c, redisstream.Options{Options: broker.DefaultOptions(), Prefix: prefix})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const nKeys = 4
	keys := []string{prefix + "order:__partitions__"}
	var names []any
	for k := range nKeys {
		keys = append(keys, fmt.Sprintf("%sorder:k%d", prefix, k))
		names = append(names, fmt.Sprintf("k%d", k))
	}

	var wg sync.WaitGroup
	errs := make(chan error, 16)
	var bad []any
	var badMu sync.Mutex
	wg.Add(2)
	go func() { // reaper
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			k := i % nKeys
			if err := reap.Run(ctx, c, []string{keys[k+1], keys[0]}, names[k]).Err(); err != nil && ctx.Err() == nil {
				errs <- err
				return
			}
		}
	}()
	go func() { // checker
		defer wg.Done()
		for ctx.Err() == nil {
			got, err := unindexed.Run(ctx, c, keys, names...).Slice()
			if err != nil {
				if ctx.Err() == nil {
					errs <- err
				}
				return
			}
			if len(got) > 0 {
				badMu.Lock()
				bad = append(bad, got...)
				badMu.Unlock()
			}
		}
	}()
	var pubs sync.WaitGroup
	for p := range 3 {
		pubs.Add(1)
		go func() {
			defer pubs.Done()
			for i := range 1500 {
				k := (i + p) % nKeys
				m := msg(fmt.Sprintf("order:k%d", k), fmt.Sprintf("p%d-%d", p, i))
				m.PartitionKey, m.Category = fmt.Sprintf("k%d", k), "order"
				if err := b.Publish(ctx, m); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	pubs.Wait()
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Empty(t, bad[:min(len(bad), 10)], "%d snapshots showed a stream with entries but no index entry", len(bad))
}
