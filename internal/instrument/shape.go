package instrument

import (
	"errors"
	"fmt"
)

// Limits bound a module's shape, which is what makes compiling it slow:
// wazero's compile time grows with the square of a function's control
// nesting depth (8,192 nested blocks take ~0.3 s, 60,000 about a minute)
// and cannot be interrupted, so a module over a limit is refused before
// it is compiled. Zero fields are unbounded.
type Limits struct {
	// MaxFunctions bounds the module's defined functions (its code
	// section's bodies).
	MaxFunctions int
	// MaxFunctionBytes bounds one function body's size in bytes (locals
	// and instructions).
	MaxFunctionBytes int
	// MaxLocals bounds one function's declared locals (parameters not
	// counted).
	MaxLocals int
	// MaxModuleLocals bounds the locals of all the module's functions
	// together (wazero's compile time grows with each function's locals:
	// 16M locals in one 77-byte function take ~0.5 s).
	MaxModuleLocals int
	// MaxNestingDepth bounds one function's control nesting: the blocks,
	// loops and ifs open at once.
	MaxNestingDepth int
	// MaxNestingCost bounds the sum, over the module's functions, of the
	// square of each one's deepest nesting: what compiling them all
	// costs (a LimitError for it names the function where the sum went
	// over).
	MaxNestingCost int
}

// ErrLimit is a module whose shape is over a Limits bound; a *LimitError
// carries the detail.
var ErrLimit = errors.New("module shape over a limit")

// LimitError is a module, or one of its functions, over a Limits bound.
type LimitError struct {
	// Func is the function's index in the module's function index space
	// (imports first); -1 for the module as a whole.
	Func int64
	// Limit names the bound as configured (max_nesting_depth, ...).
	Limit string
	// Value is the first value over the limit the walk met (it stops
	// there, so a module may have more); Max is the limit.
	Value, Max uint64
}

func (e *LimitError) Error() string {
	if e.Func < 0 {
		return fmt.Sprintf("%v: %s = %d, reached %d", ErrLimit, e.Limit, e.Max, e.Value)
	}
	return fmt.Sprintf("%v: function %d: %s = %d, reached %d", ErrLimit, e.Func, e.Limit, e.Max, e.Value)
}

// Unwrap returns ErrLimit.
func (e *LimitError) Unwrap() error { return ErrLimit }

// Names of the limits in LimitError.Limit: the config keys of
// [plugins.limits].
const (
	LimitFunctions     = "max_functions"
	LimitFunctionBytes = "max_function_bytes"
	LimitLocals        = "max_function_locals"
	LimitModuleLocals  = "max_module_locals"
	LimitNestingDepth  = "max_nesting_depth"
	LimitNestingCost   = "max_nesting_cost"
)

// over reports v over a bound max (0: unbounded) as a *LimitError.
func over(fn int64, limit string, v uint64, max int) error {
	if max > 0 && v > uint64(max) {
		return &LimitError{Func: fn, Limit: limit, Value: v, Max: uint64(max)}
	}
	return nil
}

// Check walks every function body of b as Module does, without rewriting
// anything, and returns a *LimitError for the first bound it is over:
// the check for a module that is not instrumented (deadline off, or
// wazero's). An instruction Module does not know ends the walk there
// with an *OpcodeError, as in Module.
func Check(b []byte, lim Limits) error {
	secs, err := sections(b)
	if err != nil {
		return err
	}
	var importedFuncs uint32
	for _, s := range secs {
		switch s.ID {
		case secImport:
			im, err := countImports(s.Payload)
			if err != nil {
				return err
			}
			importedFuncs = im.funcs
		case secCode:
			if _, err := parseCode(s.Payload, 0, importedFuncs, lim); err != nil {
				return err
			}
		}
	}
	return nil
}
