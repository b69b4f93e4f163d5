// Package auth is who may do what at the HTTP API: credentials, the
// principal a credential names (a tenant and a role), and the one rule of
// what a role may do.
//
// A credential is an API key: "phk_" and 32 random bytes, base64url. The
// config keeps only its SHA-256 ([Hash]); `protean-host keys new` prints a
// new key once, with the config lines to add. Several keys may name the
// same tenant and role, so a key is rotated by adding the new one, moving
// the clients, then removing the old one; a SIGHUP makes the config's
// credentials the host's, swapped whole through a [Live]. A JWKS URL is
// fetched at most once per [DefaultRefetchEvery] (jwks.go).
//
// A role acts within its tenant ([Principal.May]): read reads its
// projections; write sends its commands and reads; operator acts on its
// partitions, subscriptions, outbox rows and dead letters; deployer
// deploys its modules; admin does everything for every tenant, and alone
// reads /metrics, the whole status page and the plugins list.
package auth
