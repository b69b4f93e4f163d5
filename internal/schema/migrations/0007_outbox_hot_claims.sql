-- outbox: cheaper claims (package outbox).
--
-- A claim no longer changes a row's status (it sets locked_by,
-- locked_until and last_processed_at, none of them indexed), so PostgreSQL
-- can make it a HOT update: a new row version on the same page and no new
-- index entries. HOT needs room on the page, and a claim updates every
-- row of a page at once, so pages are filled only to half on insert; the
-- other half takes the claim's versions (a leased version is a little
-- longer, so one or two of a page's rows may miss; the dead predecessors
-- are pruned on later visits, and their space reused). This applies to pages
-- filled from now on; `VACUUM FULL outbox` rewrites the existing ones.
-- A host older than this migration does not see such a lease (it looks for
-- status 'processing'): while old and new hosts relay from one database, a
-- leased row may be published twice (a duplicate, not a loss).
ALTER TABLE outbox SET (fillfactor = 50);

-- Nothing in the host reads the outbox by correlation_id, and the index
-- cost an entry on every insert and on every update that was not HOT (the
-- column stays). An operator who looks rows up by correlation can recreate
-- it without blocking writers:
--   CREATE INDEX CONCURRENTLY outbox_correlation ON outbox (correlation_id);
DROP INDEX IF EXISTS outbox_correlation;
