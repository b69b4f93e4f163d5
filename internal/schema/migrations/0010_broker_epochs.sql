-- The epoch each broker was last marked with (package outbox, Relay).
--
-- Every publish to Redis requires an epoch marker key; a Redis that comes
-- back without it (restarted without persistence, a replica promoted
-- without it) lost what it held. The relay that meets the missing marker
-- publishes again, from this database, every row published within the
-- published retention, then sets a new marker. A broker with no row here
-- has never been marked: its first start, when there is nothing to
-- publish again.
CREATE TABLE broker_epochs (
  broker varchar(128) PRIMARY KEY,
  epoch text NOT NULL,
  marked_at timestamptz NOT NULL
);
