package host

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestComposeTakesEachFileItsOwnWay pins compose's rule (candidate.go)
// case by case, on modules named file@bytes and a validation of pairs that
// conflict, each problem named on the later file of the pair, as the
// registration rules name a conflict.
func TestComposeTakesEachFileItsOwnWay(t *testing.T) {
	type conflict struct {
		a, b string // file@bytes
		rule Rule
	}
	for _, tc := range []struct {
		name      string
		running   []string // file@bytes
		loaded    []string // file@bytes (a running one is carried)
		failed    []string // files that did not load
		conflicts []conflict
		want      []string // the set, file@bytes; nil: rejected as a whole
		rejected  []string // files held back
	}{
		{name: "all good", running: []string{"a@1", "b@1"}, loaded: []string{"a@2", "b@1", "c@1"},
			want: []string{"a@2", "b@1", "c@1"}},
		{name: "a bad file keeps its running version beside an edit", running: []string{"a@1", "b@1"},
			loaded: []string{"a@2"}, failed: []string{"b"}, want: []string{"a@2", "b@1"}, rejected: []string{"b"}},
		{name: "a new file that fails is absent", running: []string{"a@1"}, loaded: []string{"a@2"}, failed: []string{"n"},
			want: []string{"a@2"}, rejected: []string{"n"}},
		{name: "a removal applies beside a bad file", running: []string{"a@1", "b@1", "c@1"}, loaded: []string{"a@1"},
			failed: []string{"b"}, want: []string{"a@1", "b@1"}, rejected: []string{"b"}},
		{name: "the edit a problem names keeps its running version", running: []string{"a@1", "b@1"},
			loaded: []string{"a@1", "b@2"}, conflicts: []conflict{{"a@1", "b@2", RuleConsistency}},
			want: []string{"a@1", "b@1"}, rejected: []string{"b"}},
		{name: "a new file a problem names stays out", running: []string{"a@1"},
			loaded: []string{"a@1", "b@1"}, conflicts: []conflict{{"a@1", "b@1", RuleOneKey}},
			want: []string{"a@1"}, rejected: []string{"b"}},
		{name: "an edit that breaks an unchanged later file is held back", running: []string{"a@1", "z@1"},
			loaded: []string{"a@2", "z@1"}, conflicts: []conflict{{"a@2", "z@1", RuleOneKey}},
			want: []string{"a@1", "z@1"}, rejected: []string{"a"}},
		{name: "an edit named for another's conflict still goes live", running: []string{"a@1", "z@1"},
			loaded: []string{"a@2", "z@2"}, conflicts: []conflict{{"a@2", "z@2", RuleOneKey}, {"a@2", "z@1", RuleOneKey}},
			want: []string{"a@1", "z@2"}, rejected: []string{"a"}},
		{name: "two edits that need each other go together", running: []string{"a@1", "z@1"},
			loaded: []string{"a@2", "z@2"}, conflicts: []conflict{{"a@2", "z@1", RuleConsistency}, {"a@1", "z@2", RuleConsistency}},
			want: []string{"a@2", "z@2"}},
		{name: "a set broken without any change is rejected as a whole", running: []string{"a@1", "b@1", "c@1"},
			loaded: []string{"a@1", "b@1", "c@2"}, conflicts: []conflict{{"a@1", "b@1", RuleOneKey}},
			rejected: []string{"b"}},
		{name: "a re-partition is rejected as a whole", running: []string{"a@1", "b@1"},
			loaded: []string{"a@2", "b@2"}, conflicts: []conflict{{"a@2", "b@2", RuleRepartition}},
			rejected: []string{"b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mods := map[string]*Module{}
			mod := func(id string) *Module {
				if mods[id] == nil {
					file, sum, _ := strings.Cut(id, "@")
					mods[id] = &Module{File: file, SHA256: sum}
				}
				return mods[id]
			}
			running := &Set{}
			for _, id := range tc.running {
				running.modules = append(running.modules, mod(id))
			}
			var loaded []*Module
			for _, id := range tc.loaded {
				loaded = append(loaded, mod(id))
			}
			var loadErrs []error
			for _, f := range tc.failed {
				loadErrs = append(loadErrs, &LoadError{File: f, SHA256: "bad", Err: ErrNotWASM})
			}
			validate := func(ms []*Module) (*Set, []error) {
				in := map[string]bool{}
				for _, m := range ms {
					in[m.File+"@"+m.SHA256] = true
				}
				var errs []error
				for _, c := range tc.conflicts {
					if in[c.a] && in[c.b] {
						file, _, _ := strings.Cut(c.b, "@")
						errs = append(errs, &Problem{Rule: c.rule, File: file, Msg: c.a + " conflicts with " + c.b})
					}
				}
				if len(errs) > 0 {
					return nil, errs
				}
				return &Set{modules: ms}, nil
			}
			c := compose(running, loaded, loadErrs, validate)
			if tc.want == nil {
				require.Nil(t, c.set)
				require.NotEmpty(t, c.whole)
			} else {
				require.NotNil(t, c.set, "%v", c.whole)
				var got []string
				for _, m := range c.set.modules {
					got = append(got, m.File+"@"+m.SHA256)
				}
				require.Equal(t, tc.want, got)
			}
			var held []string
			for f, errs := range c.rejected {
				held = append(held, f)
				require.NotEmpty(t, errs)
				for _, err := range errs {
					require.Equal(t, f, ProblemFile(err), "each problem is the held file's: %v", err)
					var p *Problem
					var le *LoadError
					require.True(t, errors.As(err, &p) || errors.As(err, &le), "%v keeps its kind", err)
				}
			}
			slices.Sort(held)
			require.Equal(t, tc.rejected, held)
		})
	}
}
