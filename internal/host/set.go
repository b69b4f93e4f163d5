package host

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sort"
	"sync"

	"github.com/proteanhq/protean-host/abi"
)

// Route is one handler of one module.
type Route struct {
	Module  *Module
	Handler abi.Handler
}

// Set is a validated set of modules: what the host runs. It is immutable
// (its fields are unexported and its accessors return copies); a reload
// builds a new Set and swaps it in whole.
type Set struct {
	modules []*Module
	keys    map[string]PartitionKey

	commands    map[string]Route
	subscribers map[string][]Route
	messages    map[string]abi.Message
	projections map[string]Route
	owners      *Ownership

	closeOnce sync.Once
	closeErr  error
}

// ErrInvalidSet wraps the problems of a module set that cannot run.
var ErrInvalidSet = errors.New("invalid module set")

// LoadSet loads every module of dir and validates the set against broker.
// It returns the Set, or every load error and every validation problem of
// the modules that did load (and no Set: the host never runs a partial set).
func LoadSet(ctx context.Context, l *Loader, dir string, broker Broker) (*Set, []error) {
	return loadSet(ctx, l, dir, broker, nil)
}

// loadSet is LoadSet carrying over running's unchanged modules (see
// Loader.loadDir).
func loadSet(ctx context.Context, l *Loader, dir string, broker Broker, running *Set) (*Set, []error) {
	mods, errs := l.loadDir(ctx, dir, running)
	closeAll := func() {
		for _, m := range mods {
			_ = m.Close(ctx)
		}
	}
	set, problems := NewTenantSet(mods, broker, l.tenancy.Grants)
	if len(problems) > 0 || len(errs) > 0 {
		closeAll()
		for _, p := range problems {
			errs = append(errs, p)
		}
		return nil, errs
	}
	return set, nil
}

// NewSet validates modules as one set and indexes them, with no grants
// between tenants.
func NewSet(mods []*Module, broker Broker) (*Set, []*Problem) {
	return NewTenantSet(mods, broker, Grants{})
}

// NewTenantSet validates modules as one set, tenant ownership under
// grants included (ValidateTenants), and indexes them.
func NewTenantSet(mods []*Module, broker Broker, grants Grants) (*Set, []*Problem) {
	return newTenantSet(mods, broker, grants, nil)
}

// newTenantSet is NewTenantSet for a set that replaces one whose
// ownership is running (ValidateTenantsOver).
func newTenantSet(mods []*Module, broker Broker, grants Grants, running *Ownership) (*Set, []*Problem) {
	ds := make([]Declared, len(mods))
	for i, m := range mods {
		ds[i] = Declared{File: m.File, Manifest: m.Manifest, Tenant: m.Tenant}
	}
	keys, problems := Validate(ds, broker)
	owners, tp := ValidateTenantsOver(running, ds, grants)
	problems = append(problems, tp...)
	if len(problems) > 0 {
		return nil, problems
	}
	s := &Set{modules: slices.Clone(mods), keys: keys, commands: map[string]Route{}, subscribers: map[string][]Route{},
		messages: map[string]abi.Message{}, projections: map[string]Route{}, owners: owners}
	for _, m := range mods {
		for _, msg := range m.Manifest.Messages {
			s.messages[msg.Type] = msg
		}
		for _, h := range m.Manifest.Handlers {
			r := Route{Module: m, Handler: h}
			switch h.Kind {
			case abi.KindCommandHandler:
				for _, t := range h.Handles {
					s.commands[t] = r
				}
				continue
			case abi.KindProjector, abi.KindProcessManager:
				s.projections[h.Name] = r
			}
			for _, t := range h.Handles {
				s.subscribers[t] = append(s.subscribers[t], r)
			}
		}
	}
	for _, rs := range s.subscribers {
		sort.Slice(rs, func(i, j int) bool { return rs[i].Handler.Name < rs[j].Handler.Name })
	}
	return s, nil
}

// Modules returns the set's modules, in load order (a copy: the set does
// not change).
func (s *Set) Modules() []*Module { return slices.Clone(s.modules) }

// Keys returns each partitioned stream category's partition key (a copy).
func (s *Set) Keys() map[string]PartitionKey { return maps.Clone(s.keys) }

// Command returns the route of a command type.
func (s *Set) Command(typ string) (Route, bool) {
	r, ok := s.commands[typ]
	return r, ok
}

// Subscribers returns the non-command handlers of a message type, by name
// (a copy).
func (s *Set) Subscribers(typ string) []Route { return slices.Clone(s.subscribers[typ]) }

// Subscription is one reader of a category: a non-command handler that
// handles at least one of the category's message types.
type Subscription struct {
	Handler, Category string
}

// Subscriptions lists every (handler, category) pair of the set, sorted by
// handler, then category: the consumer groups a delivery source runs for
// it, each handler reading each of its categories as its own group.
func (s *Set) Subscriptions() []Subscription {
	seen := map[Subscription]bool{}
	var out []Subscription
	for _, m := range s.modules {
		for _, h := range m.Manifest.Handlers {
			if h.Kind == abi.KindCommandHandler {
				continue
			}
			for _, t := range h.Handles {
				sub := Subscription{Handler: h.Name, Category: s.messages[t].Category}
				if !seen[sub] {
					seen[sub] = true
					out = append(out, sub)
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Handler != out[j].Handler {
			return out[i].Handler < out[j].Handler
		}
		return out[i].Category < out[j].Category
	})
	return out
}

// Message returns the declaration of a message type.
func (s *Set) Message(typ string) (abi.Message, bool) {
	m, ok := s.messages[typ]
	return m, ok
}

// Projection reports whether a projector or process manager named name
// exists: the names GET /v1/projections serves.
func (s *Set) Projection(name string) bool {
	_, ok := s.projections[name]
	return ok
}

// ProjectionRoute returns the route of the projector or process manager
// named name.
func (s *Set) ProjectionRoute(name string) (Route, bool) {
	r, ok := s.projections[name]
	return r, ok
}

// Owners returns who owns each category of the set, and the grants it was
// validated with.
func (s *Set) Owners() *Ownership { return s.owners }

// PartitionField returns the partition key field of a category.
func (s *Set) PartitionField(category string) (string, bool) {
	k, ok := s.keys[category]
	return k.Field, ok
}

// Close releases every module. Closing twice is a no-op.
func (s *Set) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		var errs []error
		for _, m := range s.modules {
			errs = append(errs, m.Close(ctx))
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}
