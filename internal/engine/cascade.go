package engine

import (
	"fmt"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
)

// depth is a message's place in its causation chain.
func depth(env abi.Envelope) int {
	if env.Metadata == nil || env.Metadata.CascadeDepth < 0 {
		return 0
	}
	return env.Metadata.CascadeDepth
}

// caused is the metadata of what env's handler caused: its correlation,
// env as the cause, and one step deeper in the chain. It travels with the
// events (in the event store and through the broker) and with follow-up
// commands, so the budget holds across deliveries, not just within one
// dispatch.
func caused(env abi.Envelope) abi.Metadata {
	md := abi.Metadata{CorrelationID: correlation(env), CausationID: env.ID, CascadeDepth: depth(env) + 1}
	if env.Metadata != nil {
		md.Tenant = env.Metadata.Tenant
		// In env's trace, unless a span of its handling is at hand
		// (telemetry.Inject replaces it).
		md.TraceParent, md.TraceState = env.Metadata.TraceParent, env.Metadata.TraceState
	}
	return md
}

// causedBy is caused, for the events of a handler of module m: they also
// name the module that wrote them.
func causedBy(env abi.Envelope, m *host.Module) abi.Metadata {
	md := caused(env)
	md.Module = moduleRef(m)
	return md
}

// withinBudget fails (permanently) the first result that asks for
// follow-up work over the budget: events or commands from a message at
// the chain's maximum depth, or more of them than MaxFollowUps. A cascade
// of events and commands that feeds itself therefore ends after
// MaxCascadeDepth steps, however it loops.
func (e *Engine) withinBudget(route host.Route, envs []abi.Envelope, rs []result) []result {
	for i := range rs {
		if rs[i].err != nil {
			break
		}
		fx := rs[i].Effects
		if fx == nil {
			continue
		}
		n := len(fx.Events) + len(fx.Commands)
		var err error
		switch {
		case n == 0:
			continue
		case depth(envs[i])+1 > e.opts.MaxCascadeDepth:
			err = fmt.Errorf("%w: message %s is at depth %d of the causation chain begun by %s; its %d events and commands would be at %d (max_cascade_depth %d)",
				ErrFollowUpDepth, envs[i].ID, depth(envs[i]), correlation(envs[i]), n, depth(envs[i])+1, e.opts.MaxCascadeDepth)
		case n > e.opts.MaxFollowUps:
			err = fmt.Errorf("%w: message %s asks for %d events and commands (max_follow_ups %d)", ErrFollowUps, envs[i].ID, n, e.opts.MaxFollowUps)
		default:
			continue
		}
		rs[i].Result = abi.Result{Error: &abi.Error{Kind: abi.ErrorPermanent, Message: err.Error()}}
		rs[i].err = &HandlerError{File: route.Module.File, Handler: route.Handler.Name, Type: envs[i].Type, Kind: abi.ErrorPermanent, Err: err}
		e.log.Warn("follow-up budget exceeded", "module", route.Module.File, "handler", route.Handler.Name,
			"message_id", envs[i].ID, "correlation_id", correlation(envs[i]), "error", err)
		break
	}
	return rs
}
