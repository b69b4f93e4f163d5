// Package routes is where the running module set sends messages: each
// partitioned category's key field (what the unit of work keys outbox rows
// by), and the consumer groups of each delivery source (the broker groups,
// the partition workers, the event-store subscriptions). It is one value,
// [Table], derived from a set; [Routes] holds the running one, which a
// reload swaps whole and whose followers it then tells. The components
// read their routes here, never the engine's set, so the composition root
// builds them in dependency order, without binding one to another late.
package routes
