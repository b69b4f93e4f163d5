-- outbox: the claim's probe for an earlier row of a key reads the key's
-- active rows in id order (package outbox, claimSQL).
--
-- outbox_ordering had priority between the key and the id, so "earlier
-- rows of this key" was no range of it, and PostgreSQL's planner often
-- took the primary key instead (id < the candidate's), which walks every
-- earlier row of the outbox, published ones included: once statistics
-- showed a large backlog (an ANALYZE during a broker outage), each claim of
-- 50 rows grew from about 1 ms to 100 ms as the backlog drained, and a
-- relay moved 600 rows a second instead of 5,000. With the id right after
-- the key, the probe's row comparison (ordering_key, id) < (…) is a range of
-- this index and of no other, so the plan no longer rests on statistics.
-- Rows without a partition key compare priorities too; that is a filter on
-- the few active rows of their stream.
--
-- Building it locks the outbox against writes while it builds: on a large
-- outbox, create outbox_ordering_by_id CONCURRENTLY first with this
-- definition and this migration only swaps the names.
CREATE INDEX IF NOT EXISTS outbox_ordering_by_id ON outbox (target_broker, category, ordering_key, id)
  WHERE status IN ('pending', 'processing', 'failed', 'halted');
DROP INDEX IF EXISTS outbox_ordering;
ALTER INDEX outbox_ordering_by_id RENAME TO outbox_ordering;
