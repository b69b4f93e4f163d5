// Package groups is the broker consumer groups' delivery source: for every
// (handler, category) subscription of the running module set, one consumer
// reads the category's broker stream (the inline broker, or a Redis
// stream of an unpartitioned category) as the handler's own consumer
// group, and hands runs of what is ready to a [delivery.Handler] (the
// engine) through [delivery.Core], the algorithm the partition workers
// (package internal/redispartition) and the event-store subscriptions
// (package subscription) share.
//
// What is the groups' own is what a broker consumer group means: the
// broker owns a message's retries (a failure of the message's own is
// nacked and the broker redelivers it alone after the policy's pause and
// dead-letters it past its retries; a permanent one is rejected at once),
// an infrastructure failure is retried in place uncharged, and what a
// run did not settle is released untried so it follows in order. A
// redelivery runs alone, so only the guilty message is charged.
//
// [Consumer.Resubscribe] follows a reload: groups the new set lost stop
// after their run in hand, new ones start, and a group removed and added
// back waits for its stopping consumer. [Progress] is the groups'
// read-your-writes source.
package groups
