-- A partitioned outbox row that fails to publish on its own account past
-- its max retries is 'halted', not 'abandoned': it keeps holding back the
-- later rows of its key, so they are never delivered past it (an abandoned
-- row let them pass, and an operator's later retry then reached consumers
-- that had moved beyond it). Failures of the broker (down, restarting) are
-- never counted at all: the relay releases such rows untried.
--
-- The active-row indexes take halted rows too, so a claim's probe for an
-- earlier row of the key that holds it back finds them.
--
-- Upgrading: stop hosts older than this migration before newer ones relay:
-- an older relay does not know 'halted' and would publish past such a row.
ALTER TABLE outbox DROP CONSTRAINT outbox_status_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_status_check
  CHECK (status IN ('pending', 'processing', 'published', 'failed', 'halted', 'abandoned'));

DROP INDEX outbox_active;
CREATE INDEX outbox_active ON outbox (target_broker, priority DESC, id)
  WHERE status IN ('pending', 'processing', 'failed', 'halted');
DROP INDEX outbox_ordering;
CREATE INDEX outbox_ordering ON outbox (target_broker, category, ordering_key, priority, id)
  WHERE status IN ('pending', 'processing', 'failed', 'halted');
