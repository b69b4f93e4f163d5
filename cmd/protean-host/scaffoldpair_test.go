package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// scaffoldBuilt writes `plugin new NAME --kind KIND --category tally` into
// work/NAME and builds it with its Makefile, as an author does; it returns
// the module's .wasm.
func scaffoldBuilt(t *testing.T, work, name, kind string) string {
	t.Helper()
	dir := filepath.Join(work, name)
	code, _, errs := cli(t, "plugin", "new", name, "--kind", kind, "--category", "tally",
		"--dir", dir, "--host-src", wasmbuild.Root())
	require.Equal(t, 0, code, "plugin new %s: %s", name, errs)
	mk := exec.Command("make", "build")
	mk.Dir = dir
	mk.Env = append(os.Environ(), "GOPROXY=off")
	b, err := mk.CombinedOutput()
	require.NoError(t, err, "make build in the %s scaffold:\n%s", kind, b)
	return filepath.Join(dir, "build", name+".wasm")
}

// The process_manager scaffold dispatches Complete{Category}; the
// command_handler scaffold of the same category handles it, so the pair
// runs clean under plugin test: no command "not run", no follow-up
// failing, on the process manager's own sample messages and on commands
// that reach it through the command handler's events. (Before, nothing
// handled CompleteTally: plugin test said "not run", and a served host
// logged a warning per event that completed a tally.)
func TestProcessManagerScaffoldPairsWithCommandHandler(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("the scaffold builds with make: %v", err)
	}
	work := t.TempDir()
	cfg := configFile(t, "inline")
	ch := scaffoldBuilt(t, work, "tally", "command_handler")
	pm := scaffoldBuilt(t, work, "tally_flow", "process_manager")

	for name, messages := range map[string]string{
		"the process manager's testdata/messages.jsonl": filepath.Join(work, "tally_flow", "testdata", "messages.jsonl"),
		"commands through the command handler": messagesFile(t,
			`{"type":"RecordTally","data":{"id":"a-1","amount":60}}`,
			`{"type":"RecordTally","data":{"id":"a-1","amount":40}}`,
			`{"type":"RecordTally","data":{"id":"a-1","amount":1}}`),
	} {
		code, out, errs := cli(t, "plugin", "test", ch, pm, "--config", cfg, "--messages", messages)
		require.Equal(t, 0, code, "%s:\n%s\n%s", name, out, errs)
		require.NotContains(t, out, "not run", name)
		require.NotContains(t, errs, "level=WARN", name)
		require.Contains(t, out, "tally [tally.wasm] CompleteTally: ok", name)
		require.Equal(t, 1, strings.Count(out, "event   tally-a-1 TallyCompleted"), "%s: completed once:\n%s", name, out)
		require.Regexp(t, `\d+ messages: \d+ passed, 0 failed`, out, name)
	}
}

// README "Writing a handler" shows a two-module plugin test: its command,
// the messages file it reads (the command handler scaffold's), and its
// output, which this test compares line by line with the real one.
func TestReadmePluginTestExample(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("the scaffold builds with make: %v", err)
	}
	readme, err := os.ReadFile(filepath.Join(wasmbuild.Root(), "README.md"))
	require.NoError(t, err)
	blocks := fencedBlocks(string(readme))

	var command string
	var output, shownMessages []string
	for _, b := range blocks {
		if len(b) > 0 && strings.HasPrefix(b[0], "$ protean-host plugin test ") {
			command, output = strings.TrimPrefix(b[0], "$ "), b[1:]
		}
		if len(b) > 0 && strings.HasPrefix(b[0], `{"type":"RecordTally"`) {
			shownMessages = b
		}
	}
	require.NotEmpty(t, command, "README shows a `$ protean-host plugin test` block")
	require.NotEmpty(t, shownMessages, "README shows the messages file the example reads")

	// The modules as README's loop scaffolds them, in ~/handlers (here work).
	work := t.TempDir()
	scaffoldBuilt(t, work, "tally", "command_handler")
	scaffoldBuilt(t, work, "tally_totals", "projector")

	args := strings.Fields(command)[1:] // after protean-host
	for i, a := range args {
		if !strings.HasPrefix(a, "-") && (strings.HasSuffix(a, ".wasm") || strings.HasSuffix(a, ".jsonl")) {
			args[i] = filepath.Join(work, a) // README runs it from ~/handlers
		}
	}
	var messages string
	for i, a := range args {
		if a == "--messages" {
			messages = args[i+1]
		}
	}
	written, err := os.ReadFile(messages)
	require.NoError(t, err, "README's --messages names a file the scaffold writes")
	require.Equal(t, strings.Join(shownMessages, "\n")+"\n", string(written), "README shows the file as the scaffold writes it")

	code, out, errs := cli(t, append(args, "--config", configFile(t, "inline"))...)
	require.Equal(t, 0, code, "%s\n%s", out, errs)
	require.Equal(t, strings.Join(output, "\n")+"\n", out, "README's output is plugin test's")
}

var fence = regexp.MustCompile("^```")

// fencedBlocks returns the lines of each fenced code block of a Markdown
// text.
func fencedBlocks(md string) [][]string {
	var blocks [][]string
	var cur []string
	in := false
	for _, line := range strings.Split(md, "\n") {
		if fence.MatchString(line) {
			if in {
				blocks = append(blocks, cur)
				cur = nil
			}
			in = !in
			continue
		}
		if in {
			cur = append(cur, line)
		}
	}
	return blocks
}
