-- Event-store subscriptions' open failure records (package subscription).
--
-- An owner reads its unit's open records (failed, held, retry) every poll
-- or so, and a read with ?min_position reads them too. Resolved and skipped
-- records are never deleted (they are the operator's history: `subscriptions
-- failed --all`), and a released key resolves one record per message held
-- behind it, so without this index each read walked every record the unit
-- ever had: 45 ms at 200,000 records, 0.2 ms with it.
CREATE INDEX subscription_failures_open ON subscription_failures (consumer_group, unit, global_position)
  WHERE status IN ('failed', 'held', 'retry');
