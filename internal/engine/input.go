package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
)

// checkCommand checks a command's payload against the fields its handler's
// module declares for the type, before any guest runs: a client's mistake
// is answered as one (an *abi.InputError, 422) and never reaches the
// guest as a decode failure.
func checkCommand(route host.Route, typ string, data json.RawMessage) error {
	msg, ok := route.Module.Manifest.Message(typ)
	if !ok {
		return nil // the set's validation guarantees the declaration
	}
	return msg.CheckPayload(data)
}

// inputCause turns a command's failure caused by its own input into an
// *abi.InputError naming the field: a module that used a too-long field
// value verbatim as a record or stream id fails its output check, which
// is the client's mistake (422), not the module's (500). Any other error
// is returned as it is.
func inputCause(typ string, data json.RawMessage, err error) error {
	var ide *abi.IDLengthError
	if !errors.As(err, &ide) {
		return err
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(data, &fields) != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		var s string
		if json.Unmarshal(fields[name], &s) == nil && s == ide.ID {
			return &abi.InputError{Type: typ, Problems: []abi.FieldProblem{{Field: name,
				Reason: fmt.Sprintf("%d bytes; used as an id, it must be at most %d", len(s), abi.MaxIDLength)}}}
		}
	}
	return err
}
