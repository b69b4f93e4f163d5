package main

import (
	"bufio"
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"

	"github.com/proteanhq/protean-host/abi"
)

//go:embed scaffold/*.tmpl
var scaffold embed.FS

// The files `plugin new` writes, from the templates of scaffold/.
var scaffoldFiles = []struct{ tmpl, path string }{
	{"go.mod.tmpl", "go.mod"},
	{"main.go.tmpl", "main.go"},
	{"main_test.go.tmpl", "main_test.go"},
	{"Makefile.tmpl", "Makefile"},
	{"messages.jsonl.tmpl", "testdata/messages.jsonl"},
	{"gitignore.tmpl", ".gitignore"},
}

// scaffoldData is what the templates see. The message names derive from
// the category, so a command handler and a projector scaffolded on one
// category fit together: Record{Cat} appends {Cat}Recorded, which the
// projector, event handler and process manager read.
type scaffoldData struct {
	Name, Kind, Category, Module string
	Command, Event, Aggregate    string
	Flagged, Complete, Completed string
	HostSrc, HostBin, GoVersion  string
}

var (
	nameRE  = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)
	kinds   = []string{string(abi.KindProjector), string(abi.KindEventHandler), string(abi.KindCommandHandler), string(abi.KindProcessManager)}
	hostMod = "github.com/proteanhq/protean-host"
)

func cmdPluginNew(ctx context.Context, e *env, args []string) error {
	fs := e.flags("plugin new")
	kind := fs.String("kind", "", "what the module is: "+strings.Join(kinds, " | "))
	category := fs.String("category", "", "the stream `CATEGORY` it works on (e.g. order)")
	dir := fs.String("dir", "", "where to write it (default ./NAME; it must not exist or be empty)")
	module := fs.String("module", "", "the Go module `PATH` of its go.mod (default NAME)")
	hostSrc := fs.String("host-src", "", "the protean-host checkout its go.mod replaces "+hostMod+" with (default: found above the working directory or the protean-host binary)")
	if err := e.parseAuthor(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: protean-host plugin new NAME --kind KIND --category CATEGORY [--dir DIR]")
	}
	name := fs.Arg(0)
	if !nameRE.MatchString(name) {
		return fmt.Errorf("name %q: use lower case letters, digits and _ , starting with a letter (it names the module, its handler and its .wasm file)", name)
	}
	if !contains(kinds, *kind) {
		return fmt.Errorf("--kind %q: want one of %s", *kind, strings.Join(kinds, ", "))
	}
	if _, _, err := abi.SplitStream(*category + "-x"); err != nil || *category == "" || strings.Contains(*category, "-") {
		return fmt.Errorf("--category %q: a stream category: lower case letters, digits and _ (streams are {category}-{id})", *category)
	}
	if *dir == "" {
		*dir = name
	}
	if *module == "" {
		*module = name
	}
	src, err := findHostSrc(*hostSrc)
	if err != nil {
		return err
	}
	bin, _ := os.Executable()
	cat := pascal(*category)
	data := scaffoldData{Name: name, Kind: *kind, Category: *category, Module: *module,
		Command: "Record" + cat, Event: cat + "Recorded", Aggregate: cat, Flagged: cat + "Flagged", Complete: "Complete" + cat, Completed: cat + "Completed",
		HostSrc: src, HostBin: bin, GoVersion: goVersion(src)}
	if err := writeScaffold(*dir, data); err != nil {
		return err
	}
	if err := tidy(ctx, *dir, src); err != nil {
		return fmt.Errorf("wrote %s, but go mod tidy failed (run it there with network access): %w", *dir, err)
	}
	fmt.Fprintf(e.stdout, "wrote %s module %s in %s (go.mod replaces %s with %s)\n", *kind, name, *dir, hostMod, src)
	fmt.Fprintf(e.stdout, "next: cd %s && make    # native tests, build/%s.wasm, plugin test against testdata/messages.jsonl, embed its manifest\n", *dir, name)
	return nil
}

// writeScaffold writes the module's files into dir, which must not exist
// or be empty: nothing of an author's is overwritten.
func writeScaffold(dir string, data scaffoldData) error {
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("--dir %s exists and is not empty", dir)
	}
	for _, f := range scaffoldFiles {
		t, err := template.ParseFS(scaffold, "scaffold/"+f.tmpl)
		if err != nil {
			return err
		}
		var b bytes.Buffer
		if err := t.Execute(&b, data); err != nil {
			return err
		}
		out := b.Bytes()
		if strings.HasSuffix(f.path, ".go") {
			// The templates' conditionals leave blank lines; an author's
			// first diff should not be gofmt's.
			if out, err = format.Source(out); err != nil {
				return fmt.Errorf("scaffold %s: %w", f.path, err)
			}
		}
		if !bytes.HasSuffix(out, []byte("\n")) {
			out = append(out, '\n')
		}
		p := filepath.Join(dir, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, out, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// tidy completes the new module's go.mod and go.sum. It starts from the
// checkout's go.sum and asks the module cache only (GOPROXY=off): the
// module needs nothing the host's build did not download, so scaffolding
// works offline. If the cache lacks something, it asks the proxy.
func tidy(ctx context.Context, dir, src string) error {
	if sum, err := os.ReadFile(filepath.Join(src, "go.sum")); err == nil {
		if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
			return err
		}
	}
	run := func(env ...string) error {
		cmd := exec.CommandContext(ctx, "go", "mod", "tidy")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
		}
		return nil
	}
	if err := run("GOPROXY=off", "GOFLAGS=-mod=mod"); err == nil {
		return nil
	}
	return run("GOFLAGS=-mod=mod")
}

// findHostSrc returns the protean-host checkout: flag if set, else the
// nearest directory above the working directory, then above the running
// binary, whose go.mod is the host's module.
func findHostSrc(flag string) (string, error) {
	if flag != "" {
		abs, err := filepath.Abs(flag)
		if err != nil {
			return "", err
		}
		if !isHostRoot(abs) {
			return "", fmt.Errorf("--host-src %s: no go.mod of %s there", flag, hostMod)
		}
		return abs, nil
	}
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if bin, err := os.Executable(); err == nil {
		if p, err := filepath.EvalSymlinks(bin); err == nil {
			bin = p
		}
		starts = append(starts, filepath.Dir(bin))
	}
	for _, d := range starts {
		for {
			if isHostRoot(d) {
				return d, nil
			}
			up := filepath.Dir(d)
			if up == d {
				break
			}
			d = up
		}
	}
	return "", fmt.Errorf("cannot find the protean-host checkout (its go.mod replaces %s, whose pdk the module imports): pass --host-src DIR", hostMod)
}

func isHostRoot(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); strings.HasPrefix(line, "module ") {
			return strings.TrimSpace(strings.TrimPrefix(line, "module ")) == hostMod
		}
	}
	return false
}

// goVersion is the go line of the checkout's go.mod: the module needs what
// the pdk needs.
func goVersion(src string) string {
	b, _ := os.ReadFile(filepath.Join(src, "go.mod"))
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "go "); ok {
			return strings.TrimSpace(v)
		}
	}
	return "1.26"
}

// pascal turns a category (order_line) into a Go name (OrderLine).
func pascal(s string) string {
	var b strings.Builder
	for _, part := range strings.Split(s, "_") {
		if part == "" {
			continue
		}
		b.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	return b.String()
}
