package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/format"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testlog"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// The author's loop of README "Writing a handler", as a new author runs it
// outside this repository: plugin new (every kind), the scaffold's own
// native tests and build (its Makefile), plugin test on its sample
// messages, then a host started with run --watch that picks up a module
// dropped into its directory and serves the projection.
func TestAuthorLoop(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("the scaffold builds with make: %v", err)
	}
	work := t.TempDir()
	cfg := configFile(t, "inline")
	wasm := map[string]string{}
	for _, m := range []struct{ name, kind string }{
		{"tally", "command_handler"}, {"tally_totals", "projector"},
		{"tally_watch", "event_handler"}, {"tally_flow", "process_manager"},
	} {
		dir := filepath.Join(work, m.name)
		code, out, errs := cli(t, "plugin", "new", m.name, "--kind", m.kind, "--category", "tally",
			"--dir", dir, "--host-src", wasmbuild.Root())
		require.Equal(t, 0, code, "plugin new %s: %s", m.name, errs)
		require.Contains(t, out, "wrote "+m.kind+" module "+m.name)
		gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		require.NoError(t, err)
		require.Contains(t, string(gomod), "replace github.com/proteanhq/protean-host => "+wasmbuild.Root())
		for _, f := range []string{"main.go", "main_test.go"} {
			src, err := os.ReadFile(filepath.Join(dir, f))
			require.NoError(t, err)
			formatted, err := format.Source(src)
			require.NoError(t, err, "%s of the %s scaffold", f, m.kind)
			require.Equal(t, string(formatted), string(src), "%s of the %s scaffold is gofmt'd", f, m.kind)
		}

		// The scaffold's Makefile: its native pdktest tests, then the build.
		mk := exec.Command("make", "test", "build")
		mk.Dir = dir
		mk.Env = append(os.Environ(), "GOPROXY=off") // offline, and go.mod/go.sum as written
		b, err := mk.CombinedOutput()
		require.NoError(t, err, "make test build in the %s scaffold:\n%s", m.kind, b)
		wasm[m.name] = filepath.Join(dir, "build", m.name+".wasm")

		code, out, errs = cli(t, "plugin", "test", wasm[m.name], "--config", cfg,
			"--messages", filepath.Join(dir, "testdata", "messages.jsonl"))
		require.Equal(t, 0, code, "plugin test %s:\n%s\n%s", m.name, out, errs)
		require.Regexp(t, `\d+ messages: \d+ passed, 0 failed`, out)
	}
	// A scaffold refuses to overwrite.
	code, _, errs := cli(t, "plugin", "new", "tally", "--kind", "projector", "--category", "tally",
		"--dir", filepath.Join(work, "tally"), "--host-src", wasmbuild.Root())
	require.Equal(t, 1, code)
	require.Contains(t, errs, "not empty")

	// The four fit together: a command's event reaches the three others.
	var all []string
	for _, p := range wasm {
		all = append(all, p)
	}
	code, out, errs := cli(t, append([]string{"plugin", "test", "--config", cfg, "--messages", messagesFile(t,
		`{"type":"RecordTally","data":{"id":"a-1","amount":1500}}`)}, all...)...)
	require.Equal(t, 0, code, "%s\n%s", out, errs)
	for _, h := range []string{"tally_totals [tally_totals.wasm]", "tally_watch [tally_watch.wasm]", "tally_flow [tally_flow.wasm]", "event   tally-a-1 TallyFlagged"} {
		require.Contains(t, out, h)
	}
	require.Contains(t, errs, `msg="flagging a-1" module=tally_watch.wasm`, "a guest's ctx.Log reaches the host's log")

	// run --watch: the command handler first, then the projector dropped in
	// (written under another name and renamed, as README says).
	plugins := t.TempDir()
	wasmbuild.Copy(t, wasm["tally"], plugins, "tally.wasm")
	h := runCLI(t, "run", "--config", cfg, "--plugins", plugins, "--listen", "127.0.0.1:0", "--watch")
	require.Equal(t, 200, h.post(t, "/v1/commands/RecordTally", `{"id":"a-1","amount":5}`), "the command handler serves")
	wasmbuild.Copy(t, wasm["tally_totals"], plugins, "tally_totals.tmp")
	require.NoError(t, os.Rename(filepath.Join(plugins, "tally_totals.tmp"), filepath.Join(plugins, "tally_totals.wasm")))
	testwait.For(t, "the projector reloaded in and projecting", func() (bool, string) {
		code, body := h.get(t, "/v1/projections/tally_totals/a-1")
		return code == 200 && strings.Contains(body, `"count":1`), fmt.Sprintf("%d %s; log:\n%s", code, body, h.stderr.Tail(10))
	})
	position := h.command(t, "/v1/commands/RecordTally", `{"id":"a-1","amount":2}`)
	// README's read-your-writes (docs/http-api.md, "Reading your
	// writes"): the command's global position as min_position (polled,
	// so a loaded machine's 504 is not a failure).
	testwait.For(t, "the second record projected", func() (bool, string) {
		code, body := h.get(t, fmt.Sprintf("/v1/projections/tally_totals/a-1?min_position=%d", position))
		return code == 200 && strings.Contains(body, `"total":7`), fmt.Sprintf("%d %s", code, body)
	})
	require.Equal(t, 0, h.stop(t), "run exits 0 on SIGINT; log:\n%s", h.stderr.Tail(10))
}

// cliHost is `protean-host run` running in the test process.
type cliHost struct {
	addr   string
	stderr *testlog.Buffer
	cancel context.CancelFunc
	code   chan int
}

var listening = regexp.MustCompile(`msg=listening addr=(\S+)`)

// runCLI runs the command line in the background until stop, and waits
// for its HTTP listener.
func runCLI(t *testing.T, args ...string) *cliHost {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := &cliHost{stderr: &testlog.Buffer{}, cancel: cancel, code: make(chan int, 1)}
	go func() { h.code <- run(ctx, args, io.Discard, h.stderr) }()
	t.Cleanup(func() {
		cancel()
		<-h.code
	})
	testwait.For(t, "the host listening", func() (bool, string) {
		m := listening.FindStringSubmatch(h.stderr.String())
		if m == nil {
			select {
			case c := <-h.code:
				h.code <- c
				t.Fatalf("run exited %d before listening:\n%s", c, h.stderr.String())
			default:
			}
			return false, h.stderr.Tail(5)
		}
		h.addr = m[1]
		return true, ""
	})
	return h
}

func (h *cliHost) stop(t *testing.T) int {
	t.Helper()
	h.cancel()
	c := testwait.Recv(t, "run to return", h.code)
	h.code <- c // for the cleanup
	return c
}

func (h *cliHost) post(t *testing.T, path, body string) int {
	t.Helper()
	code, b := h.postBody(t, path, body)
	if code != 200 {
		t.Logf("POST %s: %d %s", path, code, b)
	}
	return code
}

func (h *cliHost) postBody(t *testing.T, path, body string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+h.addr+path, "application/json", bytes.NewBufferString(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// command posts a command that appends one event, and returns the
// event's global position (for min_position).
func (h *cliHost) command(t *testing.T, path, body string) int64 {
	t.Helper()
	code, answer := h.postBody(t, path, body)
	require.Equal(t, 200, code, answer)
	var res struct {
		Events []struct {
			GlobalPosition int64 `json:"global_position"`
		} `json:"events"`
	}
	require.NoError(t, json.Unmarshal([]byte(answer), &res))
	require.Len(t, res.Events, 1, answer)
	return res.Events[0].GlobalPosition
}

func (h *cliHost) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + h.addr + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var v any
	if json.Unmarshal(b, &v) == nil {
		b, _ = json.Marshal(v)
	}
	return resp.StatusCode, string(b)
}
