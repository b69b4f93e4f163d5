package host

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/proteanhq/protean-host/abi"
)

// The manifest memo: a warm start that compiles nothing.
//
// Reading a module's manifest needs the module compiled and instantiated:
// a Go module takes ~0.15-0.3 s of a core to compile from the disk cache
// and ~2.3 s cold, so a host with 200 modules spent its start compiling
// before it could validate the set and serve one command (issue 21).
// With a cache directory, what a load learned of a module is kept beside
// its compiled code, in protean-manifests/: the manifest as the module
// answered it, how its deadline is enforced, whether it has a start
// section, and its key in the compiled-code cache. A load that finds the
// memo of the same file under the same limits compiles nothing: the module
// is loaded with its code not yet compiled, as if code_idle_ms had
// released it, its manifest decoded from the memo by this host's rules,
// and its code compiled at its first call (one compile for every call that
// waits on it, within their deadlines) or, unless code_idle_ms releases
// idle code anyway, in the background, a few at a time (warm.go).
//
// A start (a directory load with no running set) that finds no memo reads
// the manifest on wazero's interpreter instead (loadInterpreted: ~0.3 s to
// compile a Go module for it, ~0.1 s for the manifest, against 1.4-3 s to
// compile it natively; 4-5 s under -race, where a native compile takes
// minutes), writes the memo, and leaves the code to be compiled as above:
// a cold start validates and serves after its manifests, not after its
// compiles. A reload compiles a new version before it goes live, as the
// running set serves meanwhile; LoadFile always compiles.
//
// A start that finds no memo but a protean.manifest custom section in the
// file (abi.ManifestSection, written by protean-host plugin
// embed-manifest) reads the manifest from it instead, decoded by the same
// rules: it prepares, compiles and runs nothing (lazySection), so the
// first command is served within the compile of its own module, not after
// every module's interpreted manifest call or preparation (issue 21). The
// module's first compile prepares its code and writes the memo.
//
// A load from a memo or a section reads its file only to hash it, through
// one reused buffer, and finds the section by the headers of the
// sections (loadUnread): it keeps none of the file's bytes, so a start
// neither allocates nor page-faults a module's size per module (most of a
// 200-module start's time when it did). Its first compile, or packing its
// bytes soon after the start (packLater), reads the file again and
// refuses it if it changed since (ErrModuleChanged: its calls fail until a
// reload loads it as it is now). A load that compiles
// (LoadFile, and so validate and plugin test, and a reload) still asks
// protean_manifest, and refuses a module whose section does not decode to
// the same manifest (ErrManifestSection): the section is trusted on a
// start because those loads check it.
//
// The memo is keyed by the file's SHA-256 and every limit that decides
// what a load finds: the table bound, the shape limits, how the deadline
// is enforced and the memory limit (under which the manifest call ran).
// A memo that does not read or decode is ignored and written again by the
// load that follows. It is trusted as the compiled code beside it is:
// whoever can write cache_dir can already run native code in the host.
// In a bounded cache (cachedir.go) a memo goes with its compiled code's
// index entry when that is pruned.

// memoDir is the memos' directory within the cache directory.
const memoDir = "protean-manifests"

// memoVersion is in every memo key: a host that changes what a memo
// means changes it, and ignores the memos of older hosts.
const memoVersion = 1

// manifestMemo is what a load learned of a module.
type manifestMemo struct {
	// Manifest is protean_manifest's answer, decoded again at each load.
	Manifest []byte `json:"manifest"`
	// Deadline and HasStart are what prepare found (Module.Deadline,
	// Module.hasStart).
	Deadline string `json:"deadline"`
	HasStart bool   `json:"has_start"`
	// Key is the code's key in the compiled-code cache's index.
	Key string `json:"key"`
}

// memoName is the memo's file name (in memoDir) of a file with SHA-256
// sum loaded under lim.
func memoName(sum [sha256.Size]byte, lim Limits) string {
	k := sha256.Sum256(fmt.Appendf(nil, "v%d %x tables=%d shape=%+v memory=%d off=%t runtime=%t", memoVersion, sum,
		lim.MaxTableElements, lim.shape(), lim.MemoryMB, lim.Uninterruptible, lim.RuntimeDeadline))
	return hex.EncodeToString(k[:]) + ".json"
}

// memo returns the memo named name and the manifest it holds, decoded by
// this host's rules; nil if there is none or it is unusable (logged).
func (l *Loader) memo(name string) (*manifestMemo, *abi.Manifest) {
	if l.cacheDir == "" {
		return nil, nil
	}
	b, err := os.ReadFile(filepath.Join(l.cacheDir, memoDir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var mm manifestMemo
	var man *abi.Manifest
	if err == nil {
		err = json.Unmarshal(b, &mm)
	}
	if err == nil && (len(mm.Manifest) == 0 || mm.Key == "") {
		err = errors.New("incomplete")
	}
	if err == nil {
		man, err = abi.DecodeManifest(mm.Manifest)
	}
	if err != nil {
		l.log.Warn("manifest memo unusable; loading the module in full", "memo", name, "err", err)
		return nil, nil
	}
	return &mm, man
}

// remember writes the memo named name (a temporary file renamed over it)
// and has the bounded cache delete it with the code it describes.
func (l *Loader) remember(name string, mm manifestMemo) {
	if l.cacheDir == "" {
		return
	}
	dir := filepath.Join(l.cacheDir, memoDir)
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		err = writeFileAtomic(dir, name, func(f *os.File) error { return json.NewEncoder(f).Encode(mm) })
	}
	if err != nil {
		l.log.Warn("manifest memo not written", "memo", name, "err", err)
		return
	}
	if l.dir != nil {
		l.dir.memo(mm.Key, filepath.Join(memoDir, name))
	}
}

// writeFileAtomic writes dir/name through write on a temporary file of
// dir renamed over it: a crash leaves the old file or the new one.
func writeFileAtomic(dir, name string, write func(*os.File) error) error {
	tmp, err := os.CreateTemp(dir, name+".*.tmp")
	if err != nil {
		return err
	}
	if err := errors.Join(write(tmp), tmp.Close()); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, name))
}
