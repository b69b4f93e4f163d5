package redispartition

import (
	"time"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/partition"
)

// DefaultConsumerOptions returns the consumer's timing and limits by
// default, which config.Default reads too ([server.partitioning] and
// [server.stream_subscription]): Protean's values. The retries are the
// broker's (one setting, stream_subscription, serves both). The required
// fields (Leases, Positions, Handler, Decode, Subscriptions, Owner) are left
// for the caller.
func DefaultConsumerOptions() ConsumerOptions {
	b := broker.DefaultOptions()
	const ttl = 15 * time.Second
	return ConsumerOptions{
		LeaseTTL:  ttl,
		Heartbeat: ttl / 5,          // a 5x margin before the lease lapses
		Poll:      10 * time.Second, // the safety net under wake-ups (idleWait)
		ReapIdle:  time.Hour,
		// A busy key's next read, within this, carries the acks: one
		// round trip to Redis a message, not two.
		AckDelay: 500 * time.Millisecond,
		Retry: delivery.Policy{MaxRetries: b.MaxRetries, Delay: b.Delay, MaxDelay: b.MaxDelay,
			Jitter: delivery.DefaultJitter},
		BatchSize:          DefaultBatchSize,
		BackfillSuffix:     partition.DefaultBackfillSuffix,
		WarnLivePartitions: 1000,
	}
}
