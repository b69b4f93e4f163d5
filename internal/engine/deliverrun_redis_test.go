package engine

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/internal/redisstream"
	"github.com/proteanhq/protean-host/internal/testserver"
)

// redisRunBroker returns a Redis Streams broker on the test server, for an
// unpartitioned category (an ordinary consumer group).
func redisRunBroker(t testing.TB) func(broker.Options) runBroker {
	return func(opts broker.Options) runBroker {
		url, prefix := testserver.Redis(t)
		o, err := redis.ParseURL(url)
		require.NoError(t, err)
		c := redis.NewClient(o)
		t.Cleanup(func() { _ = c.Close() })
		b, err := redisstream.New(c, redisstream.Options{Options: opts, Prefix: prefix})
		require.NoError(t, err)
		return b
	}
}

// On Redis, an unpartitioned category's ready run is one guest call too
// (redisstream implements broker.Batcher), with the same per-message
// retry as the inline broker: same messages, order and effects as one by
// one, in fewer calls.
func TestRedisRunIsOneCallWithPerMessageRetry(t *testing.T) {
	ops := []string{"read", "read", "transient", "read", "read"}
	requireRunWithPerMessageRetry(t, deliverOpsOn(t, redisRunBroker(t), 1, 1, ops...), deliverOpsOn(t, redisRunBroker(t), 0, 1, ops...))
}

// BenchmarkRedisDeliveryWASM is BenchmarkInlineDeliveryWASM on an
// unpartitioned category of the Redis broker: batch=64 against one
// message per guest call, same run.
func BenchmarkRedisDeliveryWASM(b *testing.B) {
	benchDeliveryWASM(b, "redis", func(b *testing.B) runBroker {
		return redisRunBroker(b)(broker.DefaultOptions())
	})
}
