// Package wasmbuild compiles Go packages of this repository to WASM modules
// for tests, with the plain Go toolchain, as an author would:
// GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared.
package wasmbuild

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

var (
	mu    sync.Mutex
	built = map[string]string{} // key → output path, shared by a test binary
	dir   string
)

// Root returns the repository root (the directory holding go.mod).
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Build compiles the package at pkg (a path relative to the repository
// root, e.g. "./plugins/examples/orders") and returns the .wasm path. vars
// are -X assignments for package main ("variant=pm"). Results are cached for
// the life of the test binary.
func Build(tb testing.TB, pkg string, vars ...string) string {
	tb.Helper()
	return build(tb, pkg, "", vars)
}

// BuildTagged is Build with build tags (go build -tags), a comma-separated
// list: a variant of a module built from other files, such as
// plugins/examples/orders without its codecs (tag reflectjson).
func BuildTagged(tb testing.TB, pkg, tags string, vars ...string) string {
	tb.Helper()
	return build(tb, pkg, tags, vars)
}

func build(tb testing.TB, pkg, tags string, vars []string) string {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	key := pkg + "|" + tags + "|" + strings.Join(vars, ",")
	if p, ok := built[key]; ok {
		return p
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "protean-wasm-")
		if err != nil {
			tb.Fatalf("wasmbuild: %v", err)
		}
		dir = d
	}
	name := strings.NewReplacer("/", "_", ".", "", "=", "-", ",", "_").Replace(strings.TrimPrefix(pkg, "./"))
	for _, v := range vars {
		name += "_" + strings.NewReplacer("=", "-", "/", "_").Replace(v)
	}
	if tags != "" {
		name += "_tags-" + strings.ReplaceAll(tags, ",", "_")
	}
	out := filepath.Join(dir, fmt.Sprintf("%d_%s.wasm", len(built), name))
	args := []string{"build", "-buildmode=c-shared", "-o", out}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	if len(vars) > 0 {
		var ld []string
		for _, v := range vars {
			if strings.Contains(v, "/") { // a full path: pkg.name=value
				ld = append(ld, "-X "+v)
				continue
			}
			ld = append(ld, "-X main."+v)
		}
		args = append(args, "-ldflags", strings.Join(ld, " "))
	}
	args = append(args, pkg)
	cmd := exec.Command("go", args...)
	cmd.Dir = Root()
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		tb.Fatalf("wasmbuild: go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	built[key] = out
	return out
}

// BuildC compiles a C example module (src relative to the repository
// root, e.g. "plugins/c/client_orders.c") with scripts/wasm-c.sh and
// returns the .wasm path, cached like Build. A missing toolchain fails
// the test with the command that installs it (make test's
// scripts/test-services.sh installs it when run as root).
func BuildC(tb testing.TB, src string) string {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	key := "c|" + src
	if p, ok := built[key]; ok {
		return p
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "protean-wasm-")
		if err != nil {
			tb.Fatalf("wasmbuild: %v", err)
		}
		dir = d
	}
	out := filepath.Join(dir, fmt.Sprintf("%d_%s.wasm", len(built), strings.TrimSuffix(filepath.Base(src), ".c")))
	cmd := exec.Command(filepath.Join(Root(), "scripts", "wasm-c.sh"), "build", src, out)
	cmd.Dir = Root()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		tb.Fatalf("wasmbuild: scripts/wasm-c.sh build %s: %v\n%s", src, err, stderr.String())
	}
	built[key] = out
	return out
}

// ABIv1 is a Build var that makes a pdk module speak ABI v1 (JSON through
// Extism memory), as every module built before ABI v2 does.
const ABIv1 = "github.com/proteanhq/protean-host/pdk.abiFlag=1"

// Copy copies the module at src into dir under name.
func Copy(tb testing.TB, src, dir, name string) string {
	tb.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		tb.Fatalf("wasmbuild: %v", err)
	}
	dst := filepath.Join(dir, name)
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		tb.Fatalf("wasmbuild: %v", err)
	}
	return dst
}

// Examples builds every example module of plugins/examples into a fresh
// directory and returns it. vars apply to every module (ABIv1 builds them
// as modules built before ABI v2 were).
func Examples(tb testing.TB, vars ...string) string {
	tb.Helper()
	entries, err := os.ReadDir(filepath.Join(Root(), "plugins", "examples"))
	if err != nil {
		tb.Fatalf("wasmbuild: %v", err)
	}
	out := tb.TempDir()
	for _, e := range entries {
		if e.IsDir() {
			Copy(tb, Build(tb, "./plugins/examples/"+e.Name(), vars...), out, e.Name()+".wasm")
		}
	}
	return out
}

// Cleanup removes the modules this test binary built. Call it from TestMain
// after m.Run.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	if dir != "" {
		_ = os.RemoveAll(dir)
		dir = ""
		built = map[string]string{}
	}
	if cacheDir != "" {
		_ = os.RemoveAll(cacheDir)
		cacheDir = ""
	}
}

// EnvCache names a directory that test loaders share as their compiled-code
// cache across test binaries (make test sets it). Compiling a Go guest takes
// ~1.5 s, and ~15 s under the race detector, so a run compiles each module
// once, in its first (non-race) pass.
const EnvCache = "PROTEAN_TEST_WASM_CACHE"

var cacheDir string

// CacheDir returns the compiled-code cache directory tests should give
// their loaders: $PROTEAN_TEST_WASM_CACHE, or one temporary directory per
// test binary, removed by Cleanup.
func CacheDir(tb testing.TB) string {
	tb.Helper()
	if d := os.Getenv(EnvCache); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			tb.Fatalf("wasmbuild: %v", err)
		}
		return d
	}
	mu.Lock()
	defer mu.Unlock()
	if cacheDir == "" {
		d, err := os.MkdirTemp("", "protean-wasm-cache-")
		if err != nil {
			tb.Fatalf("wasmbuild: %v", err)
		}
		cacheDir = d
	}
	return cacheDir
}
