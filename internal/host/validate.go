package host

import (
	"fmt"
	"sort"
	"strings"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/broker"
)

// Rule names a registration rule, for tests and for operators grepping logs.
type Rule string

// The registration rules.
const (
	RuleABIVersion     Rule = "abi_version"     // the module's ABI version is the host's
	RuleFieldExistence Rule = "field_existence" // handled types declare the partition field
	RuleOneKey         Rule = "one_key"         // one partition key per stream category
	RuleBroker         Rule = "broker"          // the broker supports partitioning
	RuleEventKey       Rule = "event_key"       // every declaration of a partitioned event carries the key
	RuleConsistency    Rule = "consistency"     // names and declarations agree across modules
	RuleRepartition    Rule = "repartition"     // a reload does not change a live category's partition key
)

// Problem is one reason a module set cannot run. Its message names the
// module file, and the handler, message type and field where they apply.
type Problem struct {
	Rule    Rule
	File    string
	Handler string
	Type    string
	Field   string
	Msg     string
}

func (p *Problem) Error() string { return p.File + ": " + p.Msg }

// Declared is a module's file name and manifest: what validation needs.
type Declared struct {
	File     string
	Manifest *abi.Manifest
	// Tenant is the module's tenant; "" is DefaultTenant.
	Tenant string
}

// Broker is what validation needs to know of the outbox broker. The
// capabilities are the broker implementation's own (its Capabilities
// method), the same the relay routes by, so validation and routing cannot
// disagree; `validate` asks the implementation without connecting.
type Broker struct {
	Name         string
	Provider     string // for messages, and for Inline
	Capabilities broker.Capability
}

// Partitioning reports whether the broker advertises STREAM_PARTITIONING.
func (b Broker) Partitioning() bool { return b.Capabilities.Has(broker.StreamPartitioning) }

// Inline reports whether the broker is the inline broker, on which
// sequential_by is an accepted no-op.
func (b Broker) Inline() bool { return b.Provider == "inline" }

// PartitionKey is the key of one partitioned stream category and who
// declared it first.
type PartitionKey struct {
	Category string
	Field    string
	File     string
	Handler  string
}

// Validate checks a whole module set, as at start and at every reload, and
// returns every problem it finds (nil when the set may run) and the
// partition key of each partitioned category.
func Validate(mods []Declared, broker Broker) (map[string]PartitionKey, []*Problem) {
	v := &validator{keys: map[string]PartitionKey{}}
	for _, d := range mods {
		if d.Manifest.ABIVersion < abi.MinVersion || d.Manifest.ABIVersion > abi.Version {
			v.add(&Problem{Rule: RuleABIVersion, File: d.File,
				Msg: fmt.Sprintf("module %s is built for ABI v%d; this host speaks ABI v%d to v%d (rebuild it with a matching pdk)",
					d.Manifest.Module.Name, d.Manifest.ABIVersion, abi.MinVersion, abi.Version)})
		}
	}
	v.consistency(mods)
	for _, d := range mods {
		for _, h := range d.Manifest.Handlers {
			v.handler(d, h)
		}
	}
	v.eventKeys(mods)
	v.broker(broker)
	return v.keys, v.problems
}

type validator struct {
	keys     map[string]PartitionKey
	problems []*Problem
}

func (v *validator) add(p *Problem) { v.problems = append(v.problems, p) }

func describe(h abi.Handler) string { return fmt.Sprintf("handler %s (%s)", h.Name, h.Kind) }

// consistency checks what must agree across modules: module and handler
// names are unique, a message type has one kind and one category, and a
// command has one handler.
func (v *validator) consistency(mods []Declared) {
	modules := map[string]string{}
	handlers := map[string]string{}
	type typeDecl struct {
		file string
		msg  abi.Message
	}
	types := map[string]typeDecl{}
	commands := map[string]string{}
	for _, d := range mods {
		m := d.Manifest
		if first, dup := modules[m.Module.Name]; dup {
			v.add(&Problem{Rule: RuleConsistency, File: d.File,
				Msg: fmt.Sprintf("module name %s is already used by %s", m.Module.Name, first)})
		} else {
			modules[m.Module.Name] = d.File
		}
		for _, h := range m.Handlers {
			if first, dup := handlers[h.Name]; dup {
				v.add(&Problem{Rule: RuleConsistency, File: d.File, Handler: h.Name,
					Msg: fmt.Sprintf("handler name %s is already used by %s (handler names name projections and process state, so they are unique across modules)", h.Name, first)})
			} else {
				handlers[h.Name] = d.File
			}
			if h.Kind != abi.KindCommandHandler {
				continue
			}
			for _, t := range h.Handles {
				if first, dup := commands[t]; dup {
					v.add(&Problem{Rule: RuleConsistency, File: d.File, Handler: h.Name, Type: t,
						Msg: fmt.Sprintf("%s handles command %s, which %s already handles (a command has one handler)", describe(h), t, first)})
				} else {
					commands[t] = fmt.Sprintf("handler %s in %s", h.Name, d.File)
				}
			}
		}
		for _, msg := range m.Messages {
			first, seen := types[msg.Type]
			if !seen {
				types[msg.Type] = typeDecl{d.File, msg}
				continue
			}
			if first.msg.Kind != msg.Kind || first.msg.Category != msg.Category {
				v.add(&Problem{Rule: RuleConsistency, File: d.File, Type: msg.Type,
					Msg: fmt.Sprintf("declares %s %s on category %s, but %s declares it as %s on category %s",
						msg.Kind, msg.Type, msg.Category, first.file, first.msg.Kind, first.msg.Category)})
			}
		}
	}
}

// handler applies rules 1 and 2 to one handler: the partition field exists
// on every handled type, and its category agrees with every other declarer.
func (v *validator) handler(d Declared, h abi.Handler) {
	m := d.Manifest
	if h.Kind == abi.KindProcessManager {
		for _, t := range h.Handles {
			msg, _ := m.Message(t)
			field := h.Correlate[t]
			if !msg.HasField(field) {
				what := "correlates"
				if h.SequentialBy.Correlation {
					what = "sets sequential_by = true and correlates"
				}
				v.add(&Problem{Rule: RuleFieldExistence, File: d.File, Handler: h.Name, Type: t, Field: field,
					Msg: fmt.Sprintf("%s %s %s by field %s, but event %s declares no field %s",
						describe(h), what, t, field, t, field)})
				continue
			}
			if h.SequentialBy.Correlation {
				v.claim(d, h, msg.Category, field)
			}
		}
		return
	}
	field := h.SequentialBy.Field
	if field == "" {
		return
	}
	ok := true
	for _, t := range h.Handles {
		msg, _ := m.Message(t)
		if !msg.HasField(field) {
			ok = false
			v.add(&Problem{Rule: RuleFieldExistence, File: d.File, Handler: h.Name, Type: t, Field: field,
				Msg: fmt.Sprintf("%s declares sequential_by = %q, but %s %s declares no field %s",
					describe(h), field, msg.Kind, t, field)})
		}
	}
	if ok {
		v.claim(d, h, h.Category, field)
	}
}

// claim records that h partitions category by field, or reports the
// conflict with an earlier declarer.
func (v *validator) claim(d Declared, h abi.Handler, category, field string) {
	first, ok := v.keys[category]
	if !ok {
		v.keys[category] = PartitionKey{Category: category, Field: field, File: d.File, Handler: h.Name}
		return
	}
	if first.Field != field {
		v.add(&Problem{Rule: RuleOneKey, File: d.File, Handler: h.Name, Field: field,
			Msg: fmt.Sprintf("stream category %s is partitioned by conflicting keys: %s (from handler %s in %s) and %s (from %s); a category can be partitioned by only one key",
				category, first.Field, first.Handler, first.File, field, describe(h))})
	}
}

// eventKeys applies rule 4: every module that declares an event type of a
// partitioned category declares its key field, so no module can emit an
// event the unit of work would have to reject for a missing key.
func (v *validator) eventKeys(mods []Declared) {
	for _, d := range mods {
		for _, msg := range d.Manifest.Messages {
			if msg.Kind != abi.MessageEvent {
				continue
			}
			k, ok := v.keys[msg.Category]
			if !ok || msg.HasField(k.Field) {
				continue
			}
			v.add(&Problem{Rule: RuleEventKey, File: d.File, Type: msg.Type, Field: k.Field,
				Msg: fmt.Sprintf("declares event %s of category %s without field %s, the category's partition key (from handler %s in %s)",
					msg.Type, msg.Category, k.Field, k.Handler, k.File)})
		}
	}
}

// broker applies rule 3.
func (v *validator) broker(b Broker) {
	if len(v.keys) == 0 || b.Partitioning() || b.Inline() {
		return
	}
	byFile := map[string][]string{}
	var files []string
	for c, k := range v.keys {
		if byFile[k.File] == nil {
			files = append(files, k.File)
		}
		byFile[k.File] = append(byFile[k.File], c)
	}
	sort.Strings(files)
	for _, f := range files {
		cats := byFile[f]
		sort.Strings(cats)
		v.add(&Problem{Rule: RuleBroker, File: f, Handler: v.keys[cats[0]].Handler,
			Msg: fmt.Sprintf("broker %s (provider %q) does not advertise STREAM_PARTITIONING, which sequential_by requires; offending categories: %s",
				b.Name, b.Provider, strings.Join(cats, ", "))})
	}
}
