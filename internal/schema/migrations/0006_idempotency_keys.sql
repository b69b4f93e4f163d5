-- Idempotency keys of commands (package idempotency): one row per
-- (command type, Idempotency-Key). A request claims its key with a pending
-- row (owner, locked_until: a lease, so a dead host's claim lapses); the
-- command's own unit of work writes its answer (state 'committed'), so a
-- command's effects and its key commit together; the full answer replaces
-- it once the command returns (state 'done').
-- request_hash is the SHA-256 of the compacted request body (another body
-- with the same key answers 422).
CREATE TABLE idempotency_keys (
  scope text NOT NULL,
  key text NOT NULL,
  request_hash bytea NOT NULL,
  state text NOT NULL CHECK (state IN ('pending', 'committed', 'done')),
  owner text,
  locked_until timestamptz,
  status integer,
  body bytea, -- the answer's exact bytes
  created_at timestamptz NOT NULL,
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (scope, key)
);
-- The purge of expired keys.
CREATE INDEX idempotency_keys_expires ON idempotency_keys (expires_at);
