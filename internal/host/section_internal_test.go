package host

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// cManifest is the C client_orders example's manifest as it answers it,
// read by a compiled load.
func cManifest(t *testing.T) []byte {
	t.Helper()
	l, err := NewLoader(LoaderOptions{GuestConcurrency: -1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	m, err := l.LoadFile(context.Background(), wasmbuild.BuildC(t, "plugins/c/client_orders.c"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	require.NotEmpty(t, m.ManifestJSON())
	return m.ManifestJSON()
}

// cWithSection writes the C client_orders example with manifest embedded
// as its protean.manifest section to a new plugins directory, and returns
// the file's path.
func cWithSection(t *testing.T, manifest []byte) string {
	t.Helper()
	b, err := os.ReadFile(wasmbuild.BuildC(t, "plugins/c/client_orders.c"))
	require.NoError(t, err)
	out, err := abi.EmbedManifest(b, manifest)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "client_orders.wasm")
	require.NoError(t, os.WriteFile(path, out, 0o644))
	return path
}

// sectionStart starts (LoadDir, compiling later) the plugins directory of
// path on a new loader over a new cache directory. code_idle_ms is on, so
// no warm-up compiles behind the test's back.
func sectionStart(t *testing.T, path string) (*Module, *Loader) {
	t.Helper()
	w := testwait.Limit()
	lim := Limits{Timeout: w, ManifestTimeout: w, CompileTimeout: w, CodeIdle: time.Hour}
	l, err := NewLoader(LoaderOptions{Limits: lim, CacheDir: t.TempDir(), GuestConcurrency: -1, CompileLater: true})
	require.NoError(t, err)
	mods, errs := l.LoadDir(context.Background(), filepath.Dir(path))
	require.Empty(t, errs)
	require.Len(t, mods, 1)
	t.Cleanup(func() {
		_ = mods[0].Close(context.Background())
		_ = l.Close(context.Background())
	})
	return mods[0], l
}

// A start that finds a module's protean.manifest section takes its
// manifest from it: nothing is prepared or compiled before the module is
// loaded; its first call prepares and compiles its code, finds how its
// deadline is enforced and writes its memo.
func TestAStartReadsTheManifestSection(t *testing.T) {
	t.Parallel()
	raw := cManifest(t)
	m, l := sectionStart(t, cWithSection(t, raw))
	require.Zero(t, l.compiles.Load(), "a start with the section compiled (the interpreter's compile?)")
	require.True(t, m.fromSection)
	require.False(t, m.Instances().CodeLoaded)
	require.Equal(t, raw, m.ManifestJSON())
	want, err := abi.DecodeManifest(raw)
	require.NoError(t, err)
	require.Equal(t, want, m.Manifest)
	require.Empty(t, m.Deadline, "not prepared at the start")
	require.Empty(t, memos(t, l.cacheDir), "no memo before the code is prepared")

	handleC(t, m)
	require.Equal(t, int64(1), l.compiles.Load(), "the first call compiled the code")
	require.True(t, m.Instances().CodeLoaded)
	require.Equal(t, DeadlineInstrumented, m.Deadline)
	require.Len(t, memos(t, l.cacheDir), 1, "the first compile wrote the memo")
}

// A module over a shape limit that a start loaded from its section (its
// code not prepared) is refused at its first compile: its calls fail
// naming the limit, and no memo is written, so no start takes it from one.
func TestAModuleFromItsSectionOverALimitFailsItsCalls(t *testing.T) {
	t.Parallel()
	path := cWithSection(t, cManifest(t))
	w := testwait.Limit()
	lim := Limits{Timeout: w, ManifestTimeout: w, CompileTimeout: w, CodeIdle: time.Hour, MaxFunctions: 2}
	l, err := NewLoader(LoaderOptions{Limits: lim, CacheDir: t.TempDir(), GuestConcurrency: -1, CompileLater: true})
	require.NoError(t, err)
	mods, errs := l.LoadDir(context.Background(), filepath.Dir(path))
	require.Empty(t, errs, "a start reads the section only")
	require.Len(t, mods, 1)
	t.Cleanup(func() {
		_ = mods[0].Close(context.Background())
		_ = l.Close(context.Background())
	})
	_, err = mods[0].Handle(context.Background(), "client_orders", orderPlaced, orderSession{})
	require.ErrorIs(t, err, ErrShapeLimit)
	require.ErrorContains(t, err, "max_functions")
	require.Zero(t, l.compiles.Load())
	require.Empty(t, memos(t, l.cacheDir))
}

// Without the section a start still reads the manifest on the
// interpreter: one compile for it.
func TestAStartWithoutTheSectionUsesTheInterpreter(t *testing.T) {
	t.Parallel()
	plugins := t.TempDir()
	path := wasmbuild.Copy(t, wasmbuild.BuildC(t, "plugins/c/client_orders.c"), plugins, "client_orders.wasm")
	m, l := sectionStart(t, path)
	require.Equal(t, int64(1), l.compiles.Load(), "the interpreter's compile")
	require.False(t, m.fromSection)
	handleC(t, m)
}

// A section that does not decode by the manifest's rules refuses the
// module at a start, as protean_manifest's answer would.
func TestAStartRefusesAnInvalidManifestSection(t *testing.T) {
	t.Parallel()
	path := cWithSection(t, []byte(`{"abi_version": 1}`))
	l, err := NewLoader(LoaderOptions{CacheDir: t.TempDir(), GuestConcurrency: -1, CompileLater: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	mods, errs := l.LoadDir(context.Background(), filepath.Dir(path))
	require.Empty(t, mods)
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], abi.ErrManifest)
	require.ErrorContains(t, errs[0], abi.ManifestSection)
	require.Zero(t, l.compiles.Load())
}

// A load that compiles (LoadFile, a reload) checks the section against
// protean_manifest's answer: the same manifest loads, another is refused
// with ErrManifestSection, which names the command that embeds it again.
func TestACompiledLoadRefusesADifferingManifestSection(t *testing.T) {
	t.Parallel()
	raw := cManifest(t)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(raw, &doc))
	doc["module"].(map[string]any)["version"] = "9.9.9"
	other, err := json.Marshal(doc)
	require.NoError(t, err)
	_, err = abi.DecodeManifest(other)
	require.NoError(t, err, "the other manifest is valid on its own")

	l, err := NewLoader(LoaderOptions{CacheDir: t.TempDir(), GuestConcurrency: -1, CompileLater: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })

	same, err := l.LoadFile(context.Background(), cWithSection(t, raw))
	require.NoError(t, err)
	require.NoError(t, same.Close(context.Background()))

	path := cWithSection(t, other)
	_, err = l.LoadFile(context.Background(), path)
	require.ErrorIs(t, err, ErrManifestSection)
	require.ErrorContains(t, err, "protean-host plugin embed-manifest")
	require.ErrorContains(t, err, "client_orders.wasm")

	// A reload (a running set) compiles the new version and checks it too.
	mods, errs := l.loadDir(context.Background(), filepath.Dir(path), &Set{})
	require.Empty(t, mods)
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], ErrManifestSection)
}

// The section is not part of the compiled code: a module with it and
// without it have one key in the compiled-code cache, so what
// plugin embed-manifest compiled is what a start finds.
func TestTheManifestSectionDoesNotChangeTheCodeKey(t *testing.T) {
	t.Parallel()
	key := func(l *Loader) string {
		names := memos(t, l.cacheDir)
		require.Len(t, names, 1)
		b, err := os.ReadFile(names[0])
		require.NoError(t, err)
		var mm manifestMemo
		require.NoError(t, json.Unmarshal(b, &mm))
		return mm.Key
	}
	m, with := sectionStart(t, cWithSection(t, cManifest(t)))
	handleC(t, m) // (its memo is written at its first compile)
	plain := wasmbuild.Copy(t, wasmbuild.BuildC(t, "plugins/c/client_orders.c"), t.TempDir(), "client_orders.wasm")
	_, without := sectionStart(t, plain)
	require.Equal(t, key(without), key(with))
}

// A start serves a module from its section without keeping its bytes:
// its first compile reads the file again, and refuses it if it changed
// since (its calls fail, naming the file, until a reload loads it as it
// is now); the file as it was compiles again.
func TestAModuleServedUnreadRefusesItsChangedFile(t *testing.T) {
	t.Parallel()
	path := cWithSection(t, cManifest(t))
	was, err := os.ReadFile(path)
	require.NoError(t, err)
	w := testwait.Limit()
	lim := Limits{Timeout: w, ManifestTimeout: w, CompileTimeout: w, CodeIdle: time.Hour}
	l, err := NewLoader(LoaderOptions{Limits: lim, CacheDir: t.TempDir(), GuestConcurrency: -1, CompileLater: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	// One file as a start loads it (loadDir, without the packing it
	// starts after the set, which would read the file at once).
	m, err := l.loadOrReuse(context.Background(), path, func() (*os.File, fs.FileInfo, error) { return openFile(path) }, nil, loadLazy)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	require.True(t, m.fromSection)
	require.NotNil(t, m.source.file, "served from the file, its bytes not kept")
	require.Nil(t, m.source.raw)

	changed := bytes.Clone(was)
	changed[len(changed)-2] ^= 1 // in the manifest's JSON: still a module
	require.NoError(t, os.WriteFile(path, changed, 0o644))
	_, err = m.Handle(context.Background(), "client_orders", orderPlaced, orderSession{})
	require.ErrorIs(t, err, ErrModuleChanged)
	require.ErrorContains(t, err, path)
	require.ErrorIs(t, m.source.pack(), ErrModuleChanged)
	require.Zero(t, l.compiles.Load())

	require.NoError(t, os.WriteFile(path, was, 0o644))
	handleC(t, m)
	require.NoError(t, m.source.pack())
	b, err := m.source.bytes()
	require.NoError(t, err)
	_, _, without, err := abi.SplitManifest(was)
	require.NoError(t, err)
	require.Equal(t, without, b, "packed, the file's code")
}

// A file's source checks the section a start served apart from its hash:
// a file that changed between the two reads is refused.
func TestAFileSourceChecksItsSection(t *testing.T) {
	t.Parallel()
	raw := []byte(`{"a":1}`)
	path := cWithSection(t, raw)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	src := newFileSource(path, sha256.Sum256(b), len(b), raw)
	got, err := src.bytes()
	require.NoError(t, err)
	require.Equal(t, len(b)-len(raw)-len(abi.ManifestSection)-3, len(got), "the code, without its section")
	src = newFileSource(path, sha256.Sum256(b), len(b), []byte(`{"a":2}`))
	_, err = src.bytes()
	require.ErrorIs(t, err, ErrModuleChanged)
	src = newFileSource(path, sha256.Sum256(b), len(b)-1, raw)
	_, err = src.bytes()
	require.ErrorIs(t, err, ErrModuleTooLarge)
	require.NoError(t, os.Remove(path))
	_, err = src.bytes()
	require.ErrorIs(t, err, fs.ErrNotExist)
	// The same bytes as hashed, that do not parse: that error, not a change.
	junk := []byte("not a module")
	require.NoError(t, os.WriteFile(path, junk, 0o644))
	_, err = newFileSource(path, sha256.Sum256(junk), len(junk), nil).bytes()
	require.ErrorIs(t, err, ErrNotWASM)
	require.NotErrorIs(t, err, ErrModuleChanged)
}
