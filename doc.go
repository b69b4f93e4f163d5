// Package proteanhost is the map of the protean-host module: a daemon
// (cmd/protean-host) that runs event-driven business logic compiled to
// WebAssembly. The module's public packages are what a user builds
// against, and nothing else:
//
//   - abi: the contract between the host and a module (abi/v2.md byte by
//     byte, for any language);
//   - pdk and pdk/pdktest: the Go kit for writing handlers, and running
//     them natively in tests;
//   - eventstore, record, outbox, position, broker, delivery and
//     partition: the seams a store, a broker or a delivery source is
//     written against (with the memory, PostgreSQL and inline
//     implementations), and clock, which their options take;
//   - eventstore/storetest, record/storetest, outbox/storetest,
//     position/positiontest, broker/brokertest and delivery/deliverytest:
//     the conformance suites a new implementation passes.
//
// Embedding the host in another program is not supported: the runtime
// (the engine, the sandbox, the delivery sources, the HTTP API, the
// configuration) is under internal/, free to change between releases,
// and the daemon and its HTTP API are the product's interface. Nothing
// that ships links package testing. docs/layout.md lists every directory.
package proteanhost
