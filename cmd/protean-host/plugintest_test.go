package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// messagesFile writes lines as a JSONL file.
func messagesFile(t *testing.T, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "messages.jsonl")
	require.NoError(t, os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	return p
}

// pluginTest runs `plugin test` on example modules with --json and
// returns the exit code and the reports.
func pluginTest(t *testing.T, modules []string, lines ...string) (int, []lineReport, string) {
	t.Helper()
	dir := wasmbuild.Examples(t)
	args := []string{"plugin", "test", "--config", configFile(t, "inline"), "--json", "--messages", messagesFile(t, lines...)}
	for _, m := range modules {
		args = append(args, filepath.Join(dir, m+".wasm"))
	}
	code, out, errs := cli(t, args...)
	var reps []lineReport
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var r lineReport
		require.NoError(t, json.Unmarshal([]byte(l), &r), "%s\nstderr: %s", l, errs)
		reps = append(reps, r)
	}
	return code, reps, errs
}

// A command runs through its handler and its events reach the module's
// subscribers, on the engine's own checks; each line's outcome is what the
// HTTP API would answer, and a line passes when it matches its expect.
func TestPluginTestRunsMessages(t *testing.T) {
	code, reps, errs := pluginTest(t, []string{"orders", "client_orders"},
		`{"type":"PlaceOrder","data":{"order_id":"o-1","client_id":"c-1","total":42.5}}`,
		`{"type":"PlaceOrder","data":{"order_id":"o-1","client_id":"c-1","total":1},"expect":"rejected"}`,
		`{"type":"PlaceOrder","data":{"order_id":"o-2","client_id":"a:b","total":1},"expect":"invalid"}`,
		`{"type":"PlaceOrder","data":{"order_id":"o-3","client_id":"c-1","total":1,"x":1},"expect":"invalid"}`,
		`# a comment, and an event from elsewhere`,
		`{"type":"OrderPlaced","stream":"order-o-9","data":{"order_id":"o-9","client_id":"c-1","total":2}}`,
	)
	require.Equal(t, 0, code, "stderr: %s\nreports: %+v", errs, reps)
	require.Len(t, reps, 5)

	placed := reps[0]
	require.Equal(t, "command", placed.Kind)
	require.Len(t, placed.Handled, 2, "the command's handler, then the projector")
	require.Equal(t, "orders", placed.Handled[0].Handler)
	require.Equal(t, "OrderPlaced", placed.Handled[0].Events[0].Type)
	proj := placed.Handled[1]
	require.Equal(t, "client_orders", proj.Handler)
	require.Equal(t, "order-o-1", proj.Stream)
	require.JSONEq(t, `{"client_id":"c-1","orders":1,"total":42.5,"order_ids":["o-1"]}`, string(proj.Writes[0].Data))

	require.Equal(t, outcomeRejected, reps[1].Outcome)
	require.Contains(t, reps[1].Error, "already exists")
	require.Len(t, reps[1].Handled, 1, "a rejected command delivers nothing")
	require.Equal(t, outcomeInvalid, reps[2].Outcome)
	require.Contains(t, reps[2].Error, "partition key contains a colon")

	require.Contains(t, reps[3].Error, "x: unknown field")
	require.Empty(t, reps[3].Handled, "no guest runs on fields that do not match")

	ev := reps[4]
	require.Equal(t, "event", ev.Kind)
	require.Len(t, ev.Handled, 1)
	require.Equal(t, int64(1), ev.Handled[0].Writes[0].ExpectedVersion, "the projector saw line 1's document")
}

// Any line whose outcome differs from its expect, or that cannot run,
// fails the run with exit 1; the other lines still run.
func TestPluginTestFails(t *testing.T) {
	code, reps, _ := pluginTest(t, []string{"orders"},
		`{"type":"PlaceOrder","data":{"order_id":"o-1","client_id":"c-1","total":"42"}}`,
		`{"type":"PlaceOrder","data":{"order_id":"o-2","client_id":"c-1","total":1},"expect":"rejected"}`,
		`{"type":"Nope","data":{}}`,
		`{"type":"PlaceOrder","data":{},"extra":1}`,
		`{"type":"OrderPlaced","data":{"order_id":"o-3","client_id":"c-1","total":1}}`,
		`{"type":"PlaceOrder","data":{"order_id":"o-4","client_id":"c-1","total":1}}`,
	)
	require.Equal(t, 1, code)
	require.Len(t, reps, 6)
	require.False(t, reps[0].Passed)
	require.Equal(t, outcomeInvalid, reps[0].Outcome, "a field of the wrong type: %s", reps[0].Error)
	require.False(t, reps[1].Passed, "ok where rejected was expected")
	require.Equal(t, outcomeOK, reps[1].Outcome)
	require.Contains(t, reps[2].Error, `type "Nope" is not declared`)
	require.Contains(t, reps[3].Error, `unknown field "extra"`)
	require.Contains(t, reps[4].Error, "needs a stream")
	require.True(t, reps[5].Passed, "lines after failures still run")
}

// A line that cannot run says why, whole, after its line number: a bad
// expect, a command given a stream, an event on another category's stream.
func TestPluginTestLineErrors(t *testing.T) {
	code, reps, _ := pluginTest(t, []string{"orders"},
		`{"type":"PlaceOrder","data":{},"expect":"maybe"}`,
		`{"type":"PlaceOrder","stream":"order-o-1","data":{}}`,
		`{"type":"OrderPlaced","stream":"client-c-1","data":{}}`,
	)
	require.Equal(t, 1, code)
	require.Len(t, reps, 3)
	for _, r := range reps {
		require.Equal(t, "error", r.Outcome)
		require.False(t, r.Passed)
	}
	require.Equal(t, `line 1: expect "maybe": want one of ok, rejected, conflict, invalid, transient, permanent`, reps[0].Error)
	require.Equal(t, "", reps[0].Kind, "refused before its declaration is looked up")
	require.Equal(t, "line 2: command PlaceOrder takes no stream", reps[1].Error)
	require.Equal(t, "command", reps[1].Kind)
	require.Equal(t, "line 3: event OrderPlaced is declared on category order, not client", reps[2].Error)
	require.Equal(t, "event", reps[2].Kind)
}

// A module set that does not load or validate stops before any message:
// exit 2, one line per problem.
func TestPluginTestRefusesBadModules(t *testing.T) {
	junk := filepath.Join(t.TempDir(), "junk.wasm")
	require.NoError(t, os.WriteFile(junk, []byte("junk"), 0o644))
	code, _, errs := cli(t, "plugin", "test", junk, "--config", configFile(t, "inline"), "--messages", messagesFile(t, `{}`))
	require.Equal(t, 2, code)
	require.Contains(t, errs, "junk.wasm")
}

// The text output names each handler and its effects, and ends with a
// count.
func TestPluginTestText(t *testing.T) {
	dir := wasmbuild.Examples(t)
	code, out, errs := cli(t, "plugin", "test", filepath.Join(dir, "orders.wasm"), "--config", configFile(t, "inline"),
		"--messages", messagesFile(t, `{"type":"PlaceOrder","data":{"order_id":"o-1","client_id":"c-1","total":1}}`))
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, "1 PlaceOrder (command): ok")
	require.Contains(t, out, "event   order-o-1 OrderPlaced")
	require.Contains(t, out, "write   aggregate order/o-1 v0→v1")
	require.Contains(t, out, "1 messages: 1 passed, 0 failed")
}
