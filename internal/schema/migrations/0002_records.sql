-- Aggregates, projection documents and process-manager state (package
-- record). version counts writes; a deleted record keeps its row with NULL
-- data as a tombstone, so its version never goes back.

CREATE TABLE records (
  kind text NOT NULL,
  type text NOT NULL,
  id text NOT NULL,
  version bigint NOT NULL CHECK (version > 0),
  data jsonb,
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (kind, type, id)
);
