-- The transactional outbox (package outbox), with the columns of Protean's
-- outbox table, plus category and ordering_key for per-key ordering.
-- message_id, stream_name, category and type are text where Protean has
-- VARCHAR(255): the event store does not bound them either.
-- partition_key keeps its width, which the key rules enforce.
--
-- last_error is Protean's JSON shape: {"message", "failed_at",
-- "retry_count"[, "reason"]}.

CREATE TABLE outbox (
  id bigserial PRIMARY KEY,
  message_id text NOT NULL,
  stream_name text NOT NULL,
  category text NOT NULL,
  type text NOT NULL,
  data jsonb,
  metadata jsonb,
  created_at timestamptz NOT NULL,
  published_at timestamptz,
  retry_count integer NOT NULL DEFAULT 0,
  last_processed_at timestamptz,
  last_error jsonb,
  status varchar(32) NOT NULL DEFAULT 'pending'
    CHECK (status IN ('pending', 'processing', 'published', 'failed', 'abandoned')),
  max_retries integer NOT NULL DEFAULT 3,
  next_retry_at timestamptz,
  locked_until timestamptz,
  locked_by varchar(128),
  correlation_id varchar(255),
  causation_id varchar(255),
  partition_key varchar(255),
  priority integer NOT NULL DEFAULT 0,
  target_broker varchar(128) NOT NULL,
  -- Rows with one (target_broker, category, ordering_key, priority) reach
  -- the broker in id order: a row is claimable only when no earlier row of
  -- its key is still active.
  ordering_key text GENERATED ALWAYS AS (coalesce(partition_key, stream_name)) STORED,
  CONSTRAINT outbox_message_broker UNIQUE (message_id, target_broker)
);

-- Claim candidates: active rows of a broker by priority, then id.
CREATE INDEX outbox_active ON outbox (target_broker, priority DESC, id)
  WHERE status IN ('pending', 'processing', 'failed');
-- The earlier-active-row-of-the-same-key probe of a claim.
CREATE INDEX outbox_ordering ON outbox (target_broker, category, ordering_key, priority, id)
  WHERE status IN ('pending', 'processing', 'failed');
CREATE INDEX outbox_correlation ON outbox (correlation_id);
-- Cleanup.
CREATE INDEX outbox_published ON outbox (published_at) WHERE status = 'published';
CREATE INDEX outbox_abandoned ON outbox (created_at) WHERE status = 'abandoned';
