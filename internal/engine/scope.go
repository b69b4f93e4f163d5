package engine

import (
	"fmt"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
)

// scope is what one module may touch, derived from its manifest AND its
// tenant's ownership (host.Ownership), so a module cannot widen it by
// declaring more: it writes aggregates, streams and events only of the
// categories it declares that its tenant owns; it reads those and the
// categories it declares that their owner grants its tenant
// (grant_read); it reads and writes the projection documents and process
// state of its own projectors and process managers; and it dispatches
// commands of its own tenant, or those another tenant grants it
// (grant_dispatch). Every host function (whatever the ABI version) and
// every effect is checked here, in one place.
type scope struct {
	file   string
	tenant string
	// refused is told of every refusal (the engine logs it and counts
	// it, naming the other tenant for the operator).
	refused func(*ScopeError)
	// write and read: categories the module may write and read.
	write, read map[string]bool
	handlers    map[string]abi.Kind
	events      map[string]string // event type → category
	set         *host.Set
}

func newScope(set *host.Set, m *host.Module, refused func(*ScopeError)) *scope {
	tenant := m.Tenant
	if tenant == "" {
		tenant = host.DefaultTenant
	}
	s := &scope{file: m.File, tenant: tenant, refused: refused, write: map[string]bool{}, read: map[string]bool{},
		handlers: map[string]abi.Kind{}, events: map[string]string{}, set: set}
	owners := set.Owners()
	grants := owners.Grants()
	allow := func(cat string) {
		owner, ok := owners.Owner(cat)
		switch {
		case !ok || owner == tenant:
			s.write[cat], s.read[cat] = true, true
		case grants.CanRead(owner, tenant, cat):
			s.read[cat] = true
		}
	}
	for _, msg := range m.Manifest.Messages {
		allow(msg.Category)
		if msg.Kind == abi.MessageEvent {
			s.events[msg.Type] = msg.Category
		}
	}
	for _, h := range m.Manifest.Handlers {
		s.handlers[h.Name] = h.Kind
		if h.Category != "" {
			allow(h.Category)
		}
	}
	return s
}

func (s *scope) refuse(format string, args ...any) error {
	return s.refuseFor("", format, args...)
}

// refuseFor is refuse of a request that reached into owner's data (""
// for none or the module's own tenant). The refusal's text, which the
// guest and the client see, never names another tenant: only the
// operator's log and metrics do (ScopeError.Owner).
func (s *scope) refuseFor(owner, format string, args ...any) error {
	if owner == s.tenant {
		owner = ""
	}
	err := &ScopeError{File: s.file, Tenant: s.tenant, What: fmt.Sprintf(format, args...), Owner: owner}
	if s.refused != nil {
		s.refused(err)
	}
	return err
}

// load checks a host-function load of a record.
func (s *scope) load(kind abi.RecordKind, typ string) error {
	if kind == abi.RecordAggregate {
		if s.read[typ] {
			return nil
		}
		return s.refuseFor(s.owner(typ), "may not read aggregates of category %s: %s", typ, s.whose(typ))
	}
	return s.record(kind, typ)
}

// whose explains why a category is out of reach, without naming another
// tenant.
func (s *scope) whose(cat string) string {
	owner, ok := s.set.Owners().Owner(cat)
	switch {
	case !ok:
		return "the module declares no messages on it"
	case owner == s.tenant:
		return fmt.Sprintf("the module declares no messages on it (it belongs to its tenant %s; declare them to use it)", owner)
	}
	return "it belongs to another tenant"
}

// record checks a write of a record (or a load of a projection or
// process state).
func (s *scope) record(kind abi.RecordKind, typ string) error {
	switch kind {
	case abi.RecordAggregate:
		if s.write[typ] {
			return nil
		}
		if s.read[typ] {
			return s.refuseFor(s.owner(typ), "may not write aggregates of category %s: it belongs to another tenant, which grants tenant %s read only", typ, s.tenant)
		}
		return s.refuseFor(s.owner(typ), "may not write aggregates of category %s: %s", typ, s.whose(typ))
	case abi.RecordProjection:
		if k := s.handlers[typ]; k == abi.KindProjector || k == abi.KindProcessManager {
			return nil
		}
		return s.refuse("projection %s is not a projector or process manager of the module", typ)
	case abi.RecordProcess:
		if s.handlers[typ] == abi.KindProcessManager {
			return nil
		}
		return s.refuse("process %s is not a process manager of the module", typ)
	}
	return s.refuse("unknown record kind %q", kind)
}

func (s *scope) owner(cat string) string {
	o, _ := s.set.Owners().Owner(cat)
	return o
}

// stream checks a host-function read of a stream.
func (s *scope) stream(stream string) error {
	cat, _, err := abi.SplitStream(stream)
	if err != nil {
		return s.refuse("%v", err)
	}
	if !s.read[cat] {
		return s.refuseFor(s.owner(cat), "may not read stream %s of category %s: %s", stream, cat, s.whose(cat))
	}
	return nil
}

// command checks a follow-up command the module asks for: its type is
// handled by a module of the module's tenant, or its owner grants it.
// An unknown type passes here and fails as unknown when dispatched.
func (s *scope) command(typ string) error {
	route, ok := s.set.Command(typ)
	if !ok {
		return nil
	}
	owner := route.Module.Tenant
	if owner == "" {
		owner = host.DefaultTenant
	}
	if owner == s.tenant || s.set.Owners().Grants().CanDispatch(owner, s.tenant, typ) {
		return nil
	}
	return s.refuseFor(owner, "may not dispatch command %s: it belongs to another tenant, which does not grant it to tenant %s", typ, s.tenant)
}

// effects checks every effect of a result against the scope.
func (s *scope) effects(e *abi.Effects) error {
	if e == nil {
		return nil
	}
	for _, w := range e.Writes {
		if err := s.record(w.Kind, w.Type); err != nil {
			return err
		}
	}
	for _, ev := range e.Events {
		cat, ok := s.events[ev.Type]
		if !ok {
			return s.refuse("emits event %s, which the module does not declare", ev.Type)
		}
		got, _, err := abi.SplitStream(ev.Stream)
		if err != nil {
			return s.refuse("%v", err)
		}
		if got != cat {
			return s.refuse("appends %s to stream %s, but %s is declared on category %s", ev.Type, ev.Stream, ev.Type, cat)
		}
		if !s.write[cat] {
			return s.refuseFor(s.owner(cat), "may not append %s to stream %s: category %s belongs to another tenant", ev.Type, ev.Stream, cat)
		}
	}
	for _, c := range e.Commands {
		if err := s.command(c.Type); err != nil {
			return err
		}
	}
	return nil
}
