package engine

import (
	"fmt"

	"github.com/proteanhq/protean-host/abi"
)

// scope is what one module may touch: aggregates of the categories its
// messages are declared on, projection documents and process state of its
// own projectors and process managers, streams of its categories, and
// events of the types it declares. Tenants' modules therefore cannot read
// or write each other's state.
type scope struct {
	file       string
	categories map[string]bool
	handlers   map[string]abi.Kind
	events     map[string]string // event type → category
}

func newScope(file string, m *abi.Manifest) *scope {
	s := &scope{file: file, categories: map[string]bool{}, handlers: map[string]abi.Kind{}, events: map[string]string{}}
	for _, msg := range m.Messages {
		s.categories[msg.Category] = true
		if msg.Kind == abi.MessageEvent {
			s.events[msg.Type] = msg.Category
		}
	}
	for _, h := range m.Handlers {
		s.handlers[h.Name] = h.Kind
	}
	return s
}

func (s *scope) record(kind abi.RecordKind, typ string) error {
	switch kind {
	case abi.RecordAggregate:
		if s.categories[typ] {
			return nil
		}
		return &ScopeError{s.file, fmt.Sprintf("aggregate category %s is not one the module declares messages on", typ)}
	case abi.RecordProjection:
		if k := s.handlers[typ]; k == abi.KindProjector || k == abi.KindProcessManager {
			return nil
		}
		return &ScopeError{s.file, fmt.Sprintf("projection %s is not a projector or process manager of the module", typ)}
	case abi.RecordProcess:
		if s.handlers[typ] == abi.KindProcessManager {
			return nil
		}
		return &ScopeError{s.file, fmt.Sprintf("process %s is not a process manager of the module", typ)}
	}
	return &ScopeError{s.file, fmt.Sprintf("unknown record kind %q", kind)}
}

func (s *scope) stream(stream string) error {
	cat, _, err := abi.SplitStream(stream)
	if err != nil {
		return &ScopeError{s.file, err.Error()}
	}
	if !s.categories[cat] {
		return &ScopeError{s.file, fmt.Sprintf("stream %s is of category %s, which the module declares no messages on", stream, cat)}
	}
	return nil
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
			return &ScopeError{s.file, fmt.Sprintf("emits event %s, which the module does not declare", ev.Type)}
		}
		got, _, err := abi.SplitStream(ev.Stream)
		if err != nil {
			return &ScopeError{s.file, err.Error()}
		}
		if got != cat {
			return &ScopeError{s.file, fmt.Sprintf("appends %s to stream %s, but %s is declared on category %s", ev.Type, ev.Stream, ev.Type, cat)}
		}
	}
	return nil
}
