package host

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
)

// A reload composes its set per module, so that one bad file does not hold
// back a good edit of another module (issue 38):
//
//  1. The candidate takes, per *.wasm file, the version now on disk if it
//     loads, else the running version of that file (a new file that does
//     not load is absent). A file gone from the directory is absent: a
//     removal always applies.
//  2. While the candidate does not validate, every changed file (new, or
//     other bytes than the running version) that a problem names goes back
//     to its running version (or out, if new), and the candidate is
//     validated again.
//  3. When the problems name no changed file (a changed module can break
//     an unchanged one that comes after it: "module name x is already used
//     by a.wasm" names the second file), every changed file that loaded,
//     those step 2 held back too, is taken back and added again one at a
//     time, in name order, each kept only if the set still validates.
//  4. When even the set without any change (the running versions, less the
//     removed files) does not validate, nothing valid can be composed: the
//     reload is rejected as a whole and the running set stays.
//
// A re-partition (RuleRepartition) is never resolved per module: it
// rejects the reload as a whole, as before. Taking back only the file that
// re-keys a category while a removal applies could drop the category from
// the set, and the next reload would then add it under the new key as a
// category that joins: the check would be bypassed without anyone asking.
//
// Each file held back is rejected with its problems; the set applied is
// valid, and every module in it is either its file's bytes on disk or the
// version that was running.

// composed is what compose made of one reload's loaded modules.
type composed struct {
	set *Set
	// rejected are the files held back, each with its problems, by file.
	rejected map[string][]error
	// sums are the SHA-256 of each rejected file's bytes, where read.
	sums map[string]string
	// whole is set when nothing valid could be composed: every problem,
	// and no set.
	whole []error
}

// candidate is what a composition tries: per file, its new version (if
// it loaded and is used) or its running version.
type candidate struct {
	running map[string]*Module // the running set's modules, by file
	carried map[string]*Module // unchanged files: their running module, retained by loadDir
	fresh   map[string]*Module // new bytes that loaded, each holding its one reference
	use     map[string]bool    // fresh files whose new version the candidate takes
	failed  map[string]bool    // files that did not load
}

// compose builds the set a reload applies from the modules loadDir loaded
// (each holding one reference) and its per-file load errors; validate
// checks a candidate. The modules of the returned set hold one reference
// each; every other module is closed.
func compose(running *Set, mods []*Module, loadErrs []error, validate func([]*Module) (*Set, []error)) composed {
	out := composed{rejected: map[string][]error{}, sums: map[string]string{}}
	c := &candidate{running: map[string]*Module{}, carried: map[string]*Module{}, fresh: map[string]*Module{},
		use: map[string]bool{}, failed: map[string]bool{}}
	if running != nil {
		for _, m := range running.Modules() {
			c.running[m.File] = m
		}
	}
	for _, m := range mods {
		if c.running[m.File] == m {
			c.carried[m.File] = m
		} else {
			c.fresh[m.File], c.use[m.File] = m, true
		}
	}
	for _, err := range loadErrs {
		var le *LoadError
		errors.As(err, &le) // the caller passes per-file errors only
		out.rejected[le.File] = append(out.rejected[le.File], err)
		out.sums[le.File] = le.SHA256
		c.failed[le.File] = true
	}
	// Step 2: hold back the new files the problems name.
	set, first := validate(c.list())
	problems := first
	for len(problems) > 0 {
		if hasRepartition(problems) {
			return c.giveUp(out, first)
		}
		var blamed []string
		for _, p := range problems {
			if f := ProblemFile(p); c.use[f] {
				out.hold(f, p, c.fresh[f])
				blamed = append(blamed, f)
			}
		}
		if len(blamed) == 0 {
			return c.oneByOne(out, first, validate)
		}
		for _, f := range blamed {
			c.use[f] = false
		}
		set, problems = validate(c.list())
	}
	return c.finish(out, set)
}

// oneByOne is step 3: from the running versions, add the new files one
// at a time, in name order, keeping each that leaves the set valid. The
// files step 2 held back are tried again: the problem that named one may
// have been another's doing.
func (c *candidate) oneByOne(out composed, first []error, validate func([]*Module) (*Set, []error)) composed {
	for f := range c.fresh {
		c.use[f] = false
		delete(out.rejected, f)
		delete(out.sums, f)
	}
	set, base := validate(c.list())
	if len(base) > 0 {
		return c.giveUp(out, first)
	}
	for _, f := range slices.Sorted(maps.Keys(c.fresh)) {
		c.use[f] = true
		next, ps := validate(c.list())
		if len(ps) == 0 {
			set = next
			continue
		}
		c.use[f] = false
		for _, p := range ps {
			out.hold(f, p, c.fresh[f])
		}
	}
	return c.finish(out, set)
}

// finish takes the references set keeps: a running version that stands in
// for its file is retained; a new version left out is closed.
func (c *candidate) finish(out composed, set *Set) composed {
	for f, m := range c.fresh {
		if !c.use[f] {
			_ = m.Close(context.Background())
		}
	}
	for _, m := range set.Modules() {
		if c.carried[m.File] != m && c.fresh[m.File] != m {
			m.retain() // the running version; the running set holds it, so it is not released
		}
	}
	out.set = set
	return out
}

// giveUp is step 4: nothing valid can be composed; every module loaded is
// closed, and the problems of the whole candidate are the reload's.
func (c *candidate) giveUp(out composed, problems []error) composed {
	for f, m := range c.fresh {
		_ = m.Close(context.Background())
		delete(out.rejected, f)
	}
	for _, m := range c.carried {
		_ = m.Close(context.Background())
	}
	for _, p := range problems {
		if f := ProblemFile(p); f != "" {
			out.hold(f, p, cmp.Or(c.fresh[f], c.running[f]))
		}
	}
	out.whole = problems
	return out
}

// list returns the candidate's modules in file order, as the loader
// loads them.
func (c *candidate) list() []*Module {
	files := map[string]bool{}
	for _, m := range []map[string]*Module{c.running, c.carried, c.fresh} {
		for f := range m {
			files[f] = true
		}
	}
	var out []*Module
	for _, f := range slices.Sorted(maps.Keys(files)) {
		switch {
		case c.carried[f] != nil:
			out = append(out, c.carried[f])
		case c.use[f]:
			out = append(out, c.fresh[f])
		case c.running[f] != nil && (c.fresh[f] != nil || c.failed[f]):
			out = append(out, c.running[f]) // held back: the running version stays
		}
		// A running file that is gone is removed.
	}
	return out
}

// HeldError is a problem of the set that held file File back, where the
// problem itself names another file (a conflict is reported on the file
// that comes second). It unwraps to the problem.
type HeldError struct {
	File string
	Err  error
}

func (e *HeldError) Error() string { return e.File + " held back: " + e.Err.Error() }

// Unwrap returns the problem.
func (e *HeldError) Unwrap() error { return e.Err }

// hold records problem p of file f, whose rejected bytes are m's.
func (o *composed) hold(f string, p error, m *Module) {
	if slices.ContainsFunc(o.rejected[f], func(e error) bool { return e == p || errors.Unwrap(e) == p }) {
		return
	}
	if ProblemFile(p) != f {
		p = &HeldError{File: f, Err: p}
	}
	o.rejected[f] = append(o.rejected[f], p)
	if m != nil && o.sums[f] == "" {
		o.sums[f] = m.SHA256
	}
}

func hasRepartition(ps []error) bool {
	for _, p := range ps {
		var pr *Problem
		if errors.As(p, &pr) && pr.Rule == RuleRepartition {
			return true
		}
	}
	return false
}
