package instrument

import (
	"errors"
	"fmt"
)

// ErrTableLimit is a table whose declared size is over the limit given to
// BoundTables.
var ErrTableLimit = errors.New("table exceeds max_table_elements")

// BoundTables gives every table the module b defines a maximum of at most
// limit elements, so table.grow can never allocate more (wazero enforces a
// table's declared maximum, 8 host bytes per element, and nothing else).
// A table declaring a maximum or an initial size above limit is refused
// (ErrTableLimit); a table declaring no maximum (as every Go guest's does)
// gets limit as its maximum, by rewriting the table section. Imported
// tables are the exporter's: guests can import only from the host's
// modules, which export none. It returns b itself when nothing needs
// rewriting; a module it cannot parse is ErrMalformed (or ErrUnsupported
// for another binary version), as for Module.
func BoundTables(b []byte, limit uint32) ([]byte, error) {
	secs, err := sections(b)
	if err != nil {
		return nil, err
	}
	for _, s := range secs {
		if s.ID != secTable {
			continue
		}
		content, err := boundTableSection(s.Payload, limit)
		if err != nil || content == nil {
			return b, err
		}
		out := make([]byte, 0, len(b)+16)
		out = append(out, b[:s.At+1]...)
		out = appendU32(out, uint32(len(content)))
		out = append(out, content...)
		return append(out, b[s.End:]...), nil
	}
	return b, nil
}

// boundTableSection checks one table section's entries against limit and
// returns the rewritten section, or nil when every table already has a
// maximum within limit.
func boundTableSection(p []byte, limit uint32) ([]byte, error) {
	r := reader{b: p}
	count, err := r.u32()
	if err != nil {
		return nil, fmt.Errorf("table section: %w", err)
	}
	out := appendU32(nil, count)
	rewrite := false
	for t := uint32(0); t < count; t++ {
		ref, err := r.byte()
		if err != nil {
			return nil, fmt.Errorf("table %d: %w", t, err)
		}
		flags, err := r.byte()
		if err != nil {
			return nil, fmt.Errorf("table %d: %w", t, err)
		}
		if flags > 1 {
			return nil, fmt.Errorf("%w: table %d: limits flags 0x%02x (only 32-bit tables with or without a maximum are accepted)", ErrTableLimit, t, flags)
		}
		minimum, err := r.u32()
		if err != nil {
			return nil, fmt.Errorf("table %d: %w", t, err)
		}
		if minimum > limit {
			return nil, fmt.Errorf("%w: table %d starts at %d elements (limit %d)", ErrTableLimit, t, minimum, limit)
		}
		maximum := limit
		if flags == 1 {
			if maximum, err = r.u32(); err != nil {
				return nil, fmt.Errorf("table %d: %w", t, err)
			}
			if maximum > limit {
				return nil, fmt.Errorf("%w: table %d may grow to %d elements (limit %d)", ErrTableLimit, t, maximum, limit)
			}
		} else {
			rewrite = true
		}
		out = append(out, ref, 1)
		out = appendU32(out, minimum)
		out = appendU32(out, maximum)
	}
	if r.off != len(p) {
		return nil, fmt.Errorf("%w: table section has %d trailing bytes", ErrMalformed, len(p)-r.off)
	}
	if !rewrite {
		return nil, nil
	}
	return out, nil
}
