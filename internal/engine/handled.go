package engine

import (
	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
)

// Handled is one message as a handler's call left it, before the commit:
// the effects it returned, checked against the module's scope, or its
// failure (a *HandlerError). A result that commits nothing (its unit of
// work then fails, e.g. on a version conflict) is reported too; the
// caller of Dispatch or Handle gets that error.
type Handled struct {
	File    string
	Handler string
	Message abi.Envelope
	Effects *abi.Effects
	Err     error
}

// handled reports a call's results up to and including its first failure.
func (e *Engine) handled(route host.Route, envs []abi.Envelope, results []result) {
	if e.opts.Handled == nil {
		return
	}
	for i, r := range results {
		if i >= len(envs) {
			return
		}
		h := Handled{File: route.Module.File, Handler: route.Handler.Name, Message: envs[i], Err: r.err}
		if r.err == nil {
			h.Effects = r.Effects
		}
		e.opts.Handled(h)
		if r.err != nil {
			return
		}
	}
}
