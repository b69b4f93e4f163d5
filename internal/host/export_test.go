package host

// CompilesStarted returns how many compilations l has started: a module
// refused before compiling starts none.
func CompilesStarted(l *Loader) int64 { return l.compiles.Load() }
