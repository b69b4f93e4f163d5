package record

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// chain folds each record's writes that follow one another by version, in
// order, and starts a chain of its own for a write that does not follow,
// after the chain it breaks, so the pipeline refuses it where it stood.
func TestChainFoldsWritesThatFollow(t *testing.T) {
	a, b := Key{Kind: "projection", Type: "t", ID: "a"}, Key{Kind: "projection", Type: "t", ID: "b"}
	w := func(k Key, expected int64, data string) Write {
		return Write{Key: k, ExpectedVersion: expected, Data: json.RawMessage(data)}
	}
	got := chain([]Write{w(a, 0, `1`), w(b, 3, `"b4"`), w(a, 1, `2`), w(a, 2, `3`), w(b, 5, `"b6"`), w(b, 4, `"b5"`), w(b, 5, `"b6"`)})
	require.Equal(t, []chained{
		{Write: w(a, 0, `3`), Steps: 3},
		{Write: w(b, 3, `"b4"`), Steps: 1},
		{Write: w(b, 5, `"b6"`), Steps: 1},
		{Write: w(b, 4, `"b6"`), Steps: 2},
	}, got)
}
