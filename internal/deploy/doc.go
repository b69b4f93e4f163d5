// Package deploy changes a tenant's modules in the plugins directory,
// each change validated as a reload of the whole directory.
//
// A Deployer has three actions, serialised by one mutex so two deploys
// never interleave their files and reloads:
//
//   - Put writes a module's new bytes (at most Options.MaxModuleBytes,
//     ErrTooLarge past it; read before the mutex is taken, so a slow
//     client holds no other deploy);
//   - Remove takes a module's file away (ErrNotFound for none);
//   - Rollback puts back the newest earlier version whose bytes differ
//     from the current ones (ErrNoHistory for none), a removed module's
//     too.
//
// Each action keeps the version it replaces in history, writes the
// directory atomically (a temporary file not named *.wasm, fsynced, then
// renamed over the module, and the directory fsynced), and calls
// Options.Reload, host.Reloader.Reload, which loads and validates the
// whole directory as at start. Applied or Unchanged: the change stands,
// and the module's history is pruned to Options.Keep versions; so it does
// when the reload applied in part (host.Partial) and none of its problems
// is the module's (another file was held back). Otherwise (Rejected,
// Canceled, or the module's own file held back): the previous bytes are
// put back byte for byte (or the new file removed), the history entry
// taken out again, and the directory reloaded once more past the
// caller's cancellation, so the reloader's status describes the directory
// again; the action returns a *RejectedError carrying the reload's
// problems. A reload that refused the module never ran its new bytes, so
// the host served its old version throughout.
//
// History lives in DIR/.history/NAME/<unix-nanos>-<sha256 prefix>.wasm.
// Neither the loader nor the watcher reads it: the loader lists only the
// entries of DIR named *.wasm and does not descend into directories, the
// watcher watches DIR alone and reacts only to *.wasm names
// (TestHistoryIsIgnoredByTheLoaderAndTheWatcher pins both). A module
// name is 1 to 128 letters, digits, '_', '-' or '.', not starting with a
// dot or a dash (CheckName): no path separator, and no name the history
// directory or a temporary file could take.
//
// Each action, refused or not, appends one audit.Entry: the principal,
// the module's tenant, the action (ActionPut, ActionRemove,
// ActionRollback), the target (the module name and the first 12 hex
// digits of the SHA-256 of the bytes it put or removed) and the outcome
// (audit.Outcome of the action's error). An entry that cannot be recorded
// is logged: the change is made, or undone, by then.
//
// Who may act is the HTTP API's to decide (package httpapi: the deployer
// role of the module's tenant, or an admin); TenantOf answers from the
// config's [tenants.NAME] modules.
package deploy
