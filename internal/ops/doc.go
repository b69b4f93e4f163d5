// Package ops is what an operator does to a running host's deliveries, one
// tenant at a time: list and inspect the Redis partitions and act on a
// halted one (skip, dlq, resume), list the event-store subscriptions and
// their failure records and act on one (retry, skip), list the outbox's
// halted and abandoned rows and act on one (retry, skip), list the dead
// letters of the broker groups and of the partitions and replay a
// running group's, and read the audit log of all of it.
//
// Every call takes a Scope: the tenants the caller may operate (an API
// key's, a token's), or all of them (an admin, the local CLI). A list
// holds only the scope's items; an action on a target outside the scope
// fails with ErrForbidden whether or not the target exists, so a tenant
// learns nothing of the others'. An item's tenant is its handler's
// module's (a partition, a subscription, a failure record: the consumer
// group is the handler) or its category's owner's (an outbox row). An
// item whose tenant the running set no longer knows (a halted partition of
// a removed handler) is an admin's.
//
// Every action, done or failed, is recorded in the audit log (package
// audit) with who asked, the tenant, the action, the target and the
// outcome.
//
// This package holds the contract: API, its types and errors, Scope and
// Tenancy, and Client. Package ops/local implements API over the host's
// own stores (Redis partitions, PostgreSQL or memory), so that the HTTP
// API (package httpapi), which serves it under /v1/ops, links no Redis
// client on a PostgreSQL-only host. Client calls those routes, so the CLI
// speaks to a local Service directly or to a host by HTTP through one
// interface, API. A Client's errors unwrap to the same sentinels
// (StatusError carries the host's status and message), so the CLI reports
// a refusal alike either way; the host, not the Client's Scope, decides
// what a key sees.
package ops
