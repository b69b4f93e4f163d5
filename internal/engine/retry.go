package engine

import "time"

// after returns a channel that fires once d has passed on the engine's
// clock (Options.Clock).
func (e *Engine) after(d time.Duration) <-chan time.Time { return e.opts.Clock.After(d) }
