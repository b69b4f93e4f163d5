package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// Each bad command body of issue 11 is the client's mistake: 422 naming
// the field (400 for a body that is not JSON), with a short answer, and
// nothing stored.
func TestEmbeddedStrictCommandInput(t *testing.T) {
	h := embedded(t, wasmbuild.Examples(t))
	long := strings.Repeat("x", 120<<10)
	for _, tc := range []struct {
		name, body string
		code       int
		field      string
		want       string
	}{
		{"string for a number", `{"order_id":"o-1","client_id":"c-1","total":"42"}`, 422, "total", `total: want a number, got string "42"`},
		{"number for a string", `{"order_id":5,"client_id":"c-1","total":1}`, 422, "order_id", "order_id: want a string, got number 5"},
		{"out of float64 range", `{"order_id":"o-1","client_id":"c-1","total":1e400}`, 422, "total", "total: number 1e400 is out of range (float64)"},
		{"120 KB id", `{"order_id":"` + long + `","client_id":"c-1","total":1}`, 422, "order_id", "order_id: 122880 bytes; used as an id, it must be at most 255"},
		{"unknown field", `{"order_id":"o-1","client_id":"c-1","total":1,"totl":2}`, 422, "totl", "totl: unknown field"},
		{"null for a required field", `{"order_id":"o-1","client_id":"c-1","total":null}`, 422, "total", "total: must not be null (required)"},
		{"missing field", `{"order_id":"o-1","client_id":"c-1"}`, 422, "total", "total: missing (required)"},
		{"long unknown field name", `{"order_id":"o-1","client_id":"c-1","total":1,"` + long + `":1}`, 422, strings.Repeat("x", 64) + "…", "unknown field"},
		{"not JSON", `total=42`, 400, "", "request body must be a JSON object: not valid JSON: invalid character 'o' in literal true (expecting 'r'), after 2 bytes"},
		{"an array", `[{"order_id":"o-1"}]`, 400, "", "request body must be a JSON object: got an array"},
		{"a string", ` "o-1" `, 400, "", "request body must be a JSON object: got a string"},
		{"null", `null`, 400, "", "request body must be a JSON object: got null"},
		{"empty", ``, 400, "", "request body must be a JSON object: the body is empty"},
		{"cut short", `{"order_id":"o-1",`, 400, "", "request body must be a JSON object: not valid JSON: unexpected end of JSON input, after 18 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, h, "PlaceOrder", tc.body)
			require.Equal(t, tc.code, r.code, r.raw)
			require.Contains(t, r.body["error"], tc.want)
			require.NotContains(t, r.raw, "Go value", "no Go type in an answer")
			require.Less(t, len(r.raw), 600, "the answer is short: %.200s", r.raw)
			if tc.field != "" {
				require.Equal(t, tc.field, r.body["fields"].([]any)[0], r.raw)
			}
		})
	}
	require.NotContains(t, h.logs.String(), strings.Repeat("x", 100), "no log line quotes the long value")
	require.NotContains(t, h.logs.String(), "level=ERROR", "a client's mistake is not a server error")
	m := get(t, h, "/metrics")
	require.NotContains(t, m.raw, `code="500"`)
	require.Contains(t, m.raw, `protean_outbox_rows{status="pending"} 0`, "nothing was stored")
	// A good command still goes through.
	r := post(t, h, "PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":42}`)
	require.Equal(t, 200, r.code, r.raw)
	require.Equal(t, 1.0, r.body["events"].([]any)[0].(map[string]any)["global_position"], "no earlier event exists")
}
