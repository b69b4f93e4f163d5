-- The published rows of each ordering key, newest first (package outbox,
-- ClaimChained): the relay gives each partitioned message the global position
-- of the row before it on its partition stream, read from here, and a
-- partition worker that has applied less than that on the stream knows the
-- stream lost a message (docs/guarantees.md). Creating it locks the outbox
-- against writes while it builds: on a large outbox, build it first with
-- CREATE INDEX CONCURRENTLY under this name.
CREATE INDEX IF NOT EXISTS outbox_published_key ON outbox (target_broker, category, ordering_key, id)
  WHERE status = 'published';
