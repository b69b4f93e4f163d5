-- Event-store subscriptions (package subscription).
--
-- subscription_leases: one row per (consumer group, unit) that some host
-- serves or served: owner is the host holding it, expires_at when it lapses
-- unless renewed (the database's clock, so hosts' clocks do not matter). A
-- host takes a unit only when the row is missing, lapsed or its own; the
-- fencing generation lives in consumer_positions, bumped by the new owner's
-- claim and checked in every effect transaction.
CREATE TABLE subscription_leases (
  consumer_group text NOT NULL,
  unit text NOT NULL,
  owner text NOT NULL,
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (consumer_group, unit)
);

-- subscription_failures: messages a subscription could not handle after
-- its retries (status failed), and the later messages of a halted
-- partition key parked behind one (held). An operator sets retry or
-- skipped; the owner then replays (resolved on success) in position order.
CREATE TABLE subscription_failures (
  consumer_group text NOT NULL,
  unit text NOT NULL,
  global_position bigint NOT NULL,
  message_id text NOT NULL,
  stream text NOT NULL,
  type text NOT NULL,
  partition_key text NOT NULL DEFAULT '',
  status text NOT NULL CHECK (status IN ('failed', 'held', 'retry', 'skipped', 'resolved')),
  attempts integer NOT NULL DEFAULT 0,
  error text NOT NULL DEFAULT '',
  failed_at timestamptz NOT NULL,
  updated_at timestamptz NOT NULL,
  PRIMARY KEY (consumer_group, unit, global_position)
);
