-- The record of what operators and deployers did (package audit): who
-- (a credential's name, never its secret), for which tenant, which action
-- on which target, and its outcome. Appended only; read newest first,
-- all of it or one tenant's.
CREATE TABLE protean_audit (
  id bigserial PRIMARY KEY,
  at timestamptz NOT NULL,
  principal text NOT NULL,
  tenant text NOT NULL,
  action text NOT NULL,
  target text NOT NULL,
  outcome text NOT NULL,
  reason text NOT NULL
);
CREATE INDEX protean_audit_tenant ON protean_audit (tenant, id);
