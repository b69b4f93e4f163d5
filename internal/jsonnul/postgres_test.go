package jsonnul_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/jsonnul"
	"github.com/proteanhq/protean-host/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// Refused refuses exactly what PostgreSQL's jsonb refuses, on strings
// built from escapes around the edges (NUL, both surrogate halves in both
// cases, their neighbours, escaped backslashes before them) and bytes that
// are not UTF-8, as values and as keys.
func TestRefusedAsPostgres(t *testing.T) {
	t.Parallel()
	pool := testserver.PostgresPool(t)
	parts := []string{`\u0000`, `\u0001`, `\ud800`, `\uD83D`, `\udbff`, `\udc00`, `\uDE00`, `\udfff`, `\ud7ff`, `\ue000`,
		`\\`, `\\u`, `\"`, `\n`, `a`, `é`, `😀`, "\xff", "\xc3", `\u0041`}
	r := rand.New(rand.NewPCG(9, 9))
	var docs []string
	for _, a := range parts {
		for _, b := range parts {
			docs = append(docs, `{"s":"`+a+b+`"}`)
		}
	}
	for range 2000 {
		var sb strings.Builder
		for range 1 + r.IntN(5) {
			sb.WriteString(parts[r.IntN(len(parts))])
		}
		docs = append(docs, fmt.Sprintf(`{"%s":1}`, sb.String()), fmt.Sprintf(`["x","%s"]`, sb.String()))
	}
	refusedByPG := 0
	for _, d := range docs {
		var ok bool
		err := pool.QueryRow(t.Context(), `SELECT $1::text::jsonb IS NOT NULL`, d).Scan(&ok)
		if err != nil {
			refusedByPG++
		}
		require.Equal(t, err != nil, jsonnul.Refused([]byte(d)) != "", "%q: PostgreSQL says %v", d, err)
	}
	require.Greater(t, refusedByPG, 100, "the corpus has refusals")
	require.Less(t, refusedByPG, len(docs)-100, "and documents PostgreSQL keeps")
}

// RefusedText refuses exactly what PostgreSQL's text refuses.
func TestRefusedTextAsPostgres(t *testing.T) {
	t.Parallel()
	pool := testserver.PostgresPool(t)
	for _, s := range []string{"order-1", "é😀", "a\x00b", "\x00", "\xff", "a\xc3", "\xe2\x82\xac", "\xed\xa0\x80", "\\u0000", ""} {
		var out string
		err := pool.QueryRow(t.Context(), `SELECT $1::text`, s).Scan(&out)
		require.Equal(t, err != nil, jsonnul.RefusedText(s) != "", "%q: PostgreSQL says %v", s, err)
	}
}
