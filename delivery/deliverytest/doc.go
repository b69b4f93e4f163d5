// Package deliverytest is the conformance suite of the delivery sources:
// the paths that read messages from somewhere (a Redis partition stream,
// the event store, a broker consumer group) and hand runs of them to a
// [delivery.Handler] through the one delivery algorithm, [delivery.Core].
// Every source runs it from a test of its own, stating in a [Features]
// value what it promises:
//
//	func TestDeliverytest(t *testing.T) {
//		deliverytest.Run(t, deliverytest.Features{Keyed: true, Halt: true},
//			func(t *testing.T) deliverytest.Harness { return newMyHarness(t) })
//	}
//
// # What it pins
//
//   - Delivery: every published message is handed to the handler once
//     and committed once, in publish order per key (keyed sources) or
//     per stream (unkeyed: the suite publishes to one).
//   - Retry: a message failing on its own with a retryable error is
//     retried, and once it succeeds within the policy's MaxRetries
//     nothing is lost, reordered or given up.
//   - Poison: a message that always fails is given up after MaxRetries
//     retries (a permanent failure at once), as the source's features say:
//     with Halt its unit stops (its key's later messages are not
//     delivered; other keys go on), with Park or DeadLetter the unit goes
//     on past it. The harness reports the given-up message.
//   - Infrastructure: a failure marked [delivery.MarkInfrastructure] is
//     retried without end and never charged: a message failing on it more
//     than MaxRetries times, then succeeding, is not given up.
//   - Stop: a Stop while a handler call is in flight lets the call return
//     and its commit count, Stop returns, and no Handle call starts after
//     it; a restart resumes after what committed (none of it is handed to
//     the handler again), with nothing lost or committed twice.
//
// The suite knows nothing of the sources' packages: it uses only package
// delivery and a [Harness], so it pins what every source promises and
// nothing one happens to do besides. A feature left false skips the tests
// that need it; a feature claimed but not delivered fails them.
//
// # How a source plugs in
//
// A [Harness] is one empty, private instance of the source and its stores
// (a Redis key prefix, a memory or PostgreSQL store of its own): Run calls
// the constructor once per subtest, from parallel subtests. The suite
// publishes through [Harness.Publish], starts the source with
// [Harness.Start] (its own scripted handler, its [delivery.Policy] with
// millisecond delays, its classification, [Classify]), and stops it with
// the function Start returned. The suite's handler does not know the
// source's stores, so it commits through [Harness.Commit]: the harness
// commits the messages' position fenced by the batch's generation, as the
// source's real handler (the engine) commits effects with it, and returns
// position.ErrApplied or position.ErrFenced as the stores do. Only a call
// whose Commit succeeded counts as committed. [Harness.GivenUp] reads the
// source's own record of the messages it gave up (a halt, a failure
// record, a dead letter).
//
// The source must hand each message's Type and Data as published (the
// suite knows a message by the "name" in its data, so one delivered
// before Publish returned is known too) and, when keyed, its key as
// delivery.Message.PartitionKey, under the ID Publish returned.
//
// Every wait is on a condition, bounded by testwait.Limit (60 s, more
// under -race); nothing asserts how fast anything happens. The only fixed
// pauses are short windows in which a source that breaks a promise (Stop
// returning with a call in flight, a call after Stop) gets the chance to
// show it; a source that keeps it passes whatever the load.
package deliverytest
