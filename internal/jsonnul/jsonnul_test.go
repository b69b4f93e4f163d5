package jsonnul_test

import (
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/jsonnul"
)

func TestRefusedNUL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		json string
		want bool
	}{
		{`{"a":"b"}`, false},
		{`{"a":"\u0000"}`, true},
		{`{"a":"x\u0000y"}`, true},
		{`{"\u0000":1}`, true},
		{`["\u0001","\u00000"]`, true},
		{`{"a":"\\u0000"}`, false}, // a backslash, then the text u0000
		{`{"a":"\\\u0000"}`, true}, // a backslash, then a NUL
		{`{"a":"\u0100\u1000"}`, false},
		{`{"a":"\"\u000"}`, false}, // not valid JSON, but no NUL either
		{`"\\"`, false},
		{`null`, false},
	} {
		if json.Valid([]byte(tc.json)) {
			var v any
			require.NoError(t, json.Unmarshal([]byte(tc.json), &v))
		}
		require.Equal(t, tc.want, jsonnul.Refused([]byte(tc.json)) != "", tc.json)
	}
}

// FuzzRefused checks Refused against encoding/json's decoding: a valid
// document with a NUL in a string, or with bytes that are not UTF-8, is
// refused (TestRefusedAsPostgres checks the surrogates against the
// database).
func FuzzRefused(f *testing.F) {
	for _, s := range []string{`{"a":"\u0000"}`, `{"a":"\\u0000"}`, `["\\\u0000"]`, `{"\u0000":"x"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var v any
		if json.Unmarshal(b, &v) != nil {
			return
		}
		if hasNUL(v) || !utf8.Valid(b) {
			require.NotEmpty(t, jsonnul.Refused(b), "%s", b)
		}
	})
}

func hasNUL(v any) bool {
	switch v := v.(type) {
	case string:
		return containsNUL(v)
	case []any:
		for _, e := range v {
			if hasNUL(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range v {
			if containsNUL(k) || hasNUL(e) {
				return true
			}
		}
	}
	return false
}

func containsNUL(s string) bool {
	for i := range len(s) {
		if s[i] == 0 {
			return true
		}
	}
	return false
}
