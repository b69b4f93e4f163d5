package host

import (
	"sort"
	"strings"

	"github.com/proteanhq/protean-host/abi"
)

// Partitioning is how the set partitions what a handler reads and writes,
// as `protean-host validate`, GET /v1/plugins and the status page show it:
// one derivation, so that they agree (a command handler that declares no
// sequential_by still writes its category's events under the key another
// handler's sequential_by gave the category).
type Partitioning struct {
	// Categories are the categories the handler writes (its own) or reads
	// (those of the messages it handles), each once, in that order.
	Categories []string
	// Keys maps each partitioned one of Categories to its key field; nil
	// when none is.
	Keys map[string]string
	// Correlated is a process manager's sequential_by = true: its units
	// are the correlation values, each spanning its categories.
	Correlated bool
}

// Partitioning returns how the set partitions handler h's categories.
func (s *Set) Partitioning(h abi.Handler) Partitioning {
	p := Partitioning{Categories: []string{}, Correlated: Correlated(h)}
	seen := map[string]bool{}
	add := func(c string) {
		if c == "" || seen[c] {
			return
		}
		seen[c] = true
		p.Categories = append(p.Categories, c)
		if f, ok := s.PartitionField(c); ok {
			if p.Keys == nil {
				p.Keys = map[string]string{}
			}
			p.Keys[c] = f
		}
	}
	add(h.Category)
	for _, t := range h.Handles {
		if msg, ok := s.Message(t); ok {
			add(msg.Category)
		}
	}
	return p
}

// Correlated reports whether h is a process manager partitioned by its
// correlation values (sequential_by = true).
func Correlated(h abi.Handler) bool {
	return h.Kind == abi.KindProcessManager && h.SequentialBy.Correlation
}

// KeyText renders the keys for a person: "order by client_id", several
// sorted and comma-separated, with " (correlate)" after a correlated
// process manager's; "" when no category is partitioned.
func (p Partitioning) KeyText() string {
	parts := make([]string, 0, len(p.Keys))
	for c, f := range p.Keys {
		parts = append(parts, c+" by "+f)
	}
	if len(parts) == 0 {
		return ""
	}
	sort.Strings(parts)
	out := strings.Join(parts, ", ")
	if p.Correlated {
		out += " (correlate)"
	}
	return out
}
