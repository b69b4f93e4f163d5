package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	extism "github.com/extism/go-sdk"
	"github.com/tetratelabs/wazero"
)

// cacheIndexFile is the index cacheDir keeps in the cache directory.
const cacheIndexFile = "protean-cache-index.json"

// kernelKey is the index entry of the Extism kernel (and of the empty
// module compiled to reach it): written by the first compile, read by
// every one after, never pruned.
const kernelKey = "extism-kernel"

// cacheDir keeps wazero's compiled-code cache directory within a size
// ([plugins] cache_max_mb). wazero names each file by a hash of the code
// and its compiler that we cannot compute, so the files a module owns are
// learned as they are written: compiles are serialized, the wazero
// directories are listed before and after each, and the files that
// appeared are recorded under the module's key (the SHA-256 of the code
// handed to wazero, and how its deadline is enforced, which wazero's key
// also covers). A compile that adds no file was a hit: it stamps the
// entry's last use. After a compile that wrote something, the entries
// least recently used are deleted, oldest first, until the directory fits,
// except the modules currently loaded, the one just compiled and the
// Extism kernel (compiled at NewLoader, before any module, so that it is
// not taken for part of the first module). A file no entry names (written
// before the index existed, by another wazero version, or by another host
// sharing the directory outside our compiles) is counted but never
// deleted: deleting what we cannot attribute could cost every restart a
// compile.
type cacheDir struct {
	dir      string
	maxBytes int64
	log      *slog.Logger
	now      func() time.Time

	// compileMu serializes compiles, so that the files a compile adds are
	// its own.
	compileMu sync.Mutex
	mu        sync.Mutex
	live      map[string]int // key → modules loaded with it
}

type cacheEntry struct {
	Module string    `json:"module"`
	Files  []string  `json:"files"` // relative to the cache directory
	Used   time.Time `json:"used"`
	// Memos are the manifest memos (memo.go) of the modules loaded
	// with this code, deleted with its files.
	Memos []string `json:"memos,omitempty"`
}

func newCacheDir(dir string, maxBytes int64, log *slog.Logger) *cacheDir {
	return &cacheDir{dir: dir, maxBytes: maxBytes, log: log, now: time.Now, live: map[string]int{}}
}

// warm compiles the Extism kernel, under both runtime configurations a
// module may be compiled with, and records its files as kernelKey's.
func (c *cacheDir) warm(ctx context.Context, cache wazero.CompilationCache) error {
	// The smallest module: the magic number and version 1.
	empty := []byte{0x00, 'a', 's', 'm', 0x01, 0x00, 0x00, 0x00}
	return c.compile(kernelKey, "", func() error {
		for _, closeOnDone := range []bool{false, true} {
			rc := wazero.NewRuntimeConfig().WithCompilationCache(cache).WithCloseOnContextDone(closeOnDone)
			p, err := extism.NewCompiledPlugin(ctx, extism.Manifest{Wasm: []extism.Wasm{extism.WasmData{Data: empty, Name: "main"}}},
				extism.PluginConfig{RuntimeConfig: rc, EnableWasi: true}, nil)
			if err != nil {
				return fmt.Errorf("compiling the Extism kernel: %w", err)
			}
			_ = p.Close(ctx)
		}
		return nil
	})
}

// compile runs fn, a compile of the code with key (of the module named
// module), records the files it wrote, or its use, and prunes.
func (c *cacheDir) compile(key, module string, fn func() error) error {
	c.compileMu.Lock()
	defer c.compileMu.Unlock()
	before, _ := c.files()
	err := fn()
	after, size := c.files()
	var added []string
	for f := range after {
		if _, ok := before[f]; !ok {
			added = append(added, f)
		}
	}
	slices.Sort(added)
	idx := c.read()
	now := c.now()
	switch e := idx[key]; {
	case len(added) > 0 && e != nil:
		e.Files = slices.Compact(slices.Sorted(slices.Values(append(e.Files, added...))))
		e.Used = now
	case len(added) > 0:
		idx[key] = &cacheEntry{Module: module, Files: added, Used: now}
	case e != nil:
		e.Used = now
	default:
		return err // a hit on what the index does not know: nothing to record
	}
	for k, e := range idx { // entries whose files are gone (deleted by hand)
		if !slices.ContainsFunc(e.Files, func(f string) bool { _, ok := after[f]; return ok }) {
			delete(idx, k)
		}
	}
	if len(added) > 0 && c.maxBytes > 0 && size > c.maxBytes {
		c.prune(idx, key, after, size)
	}
	if werr := c.write(idx); werr != nil {
		c.log.Warn("compiled-code cache index not written", "dir", c.dir, "err", werr)
	}
	return err
}

// prune deletes the files of the least recently used entries, except
// those in use, until the directory holds at most maxBytes. files are the
// directory's files and their sizes, size their sum.
func (c *cacheDir) prune(idx map[string]*cacheEntry, current string, files map[string]int64, size int64) {
	c.mu.Lock()
	var victims []string
	for k := range idx {
		if k != current && k != kernelKey && c.live[k] == 0 {
			victims = append(victims, k)
		}
	}
	c.mu.Unlock()
	slices.SortFunc(victims, func(a, b string) int { return idx[a].Used.Compare(idx[b].Used) })
	kept := map[string]bool{} // files a remaining entry names
	for k, e := range idx {
		if !slices.Contains(victims, k) {
			for _, f := range e.Files {
				kept[f] = true
			}
		}
	}
	for _, k := range victims {
		if size <= c.maxBytes {
			break
		}
		for _, f := range idx[k].Files {
			if kept[f] {
				continue
			}
			if err := os.Remove(filepath.Join(c.dir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				c.log.Warn("compiled-code cache file not deleted", "file", f, "err", err)
				continue
			}
			size -= files[f]
		}
		for _, f := range idx[k].Memos {
			if err := os.Remove(filepath.Join(c.dir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				c.log.Warn("manifest memo not deleted", "file", f, "err", err)
			}
		}
		c.log.Info("compiled-code cache: pruned", "module", idx[k].Module, "key", k, "used", idx[k].Used, "cache_bytes", size)
		delete(idx, k)
	}
}

// files lists the files of the cache directory's wazero directories
// (relative to it) with their sizes, and their total size.
func (c *cacheDir) files() (map[string]int64, int64) {
	out := map[string]int64{}
	var total int64
	dirs, _ := filepath.Glob(filepath.Join(c.dir, "wazero-*"))
	for _, d := range dirs {
		entries, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if !e.Type().IsRegular() || strings.HasSuffix(e.Name(), ".tmp") {
				continue
			}
			info, err := e.Info()
			if err != nil {
				continue
			}
			out[filepath.Join(filepath.Base(d), e.Name())] = info.Size()
			total += info.Size()
		}
	}
	return out, total
}

// read returns the index, empty if there is none or it does not parse (the
// files it named are then unknown, kept, not deleted).
func (c *cacheDir) read() map[string]*cacheEntry {
	idx := map[string]*cacheEntry{}
	b, err := os.ReadFile(filepath.Join(c.dir, cacheIndexFile))
	if err == nil {
		if err := json.Unmarshal(b, &idx); err != nil {
			c.log.Warn("compiled-code cache index unreadable; starting a new one", "dir", c.dir, "err", err)
			idx = map[string]*cacheEntry{}
		}
	}
	return idx
}

// write replaces the index (a temporary file renamed over it: a crash
// leaves the old one or the new one).
func (c *cacheDir) write(idx map[string]*cacheEntry) error {
	b, err := json.MarshalIndent(idx, "", "\t")
	if err != nil {
		return err
	}
	return writeFileAtomic(c.dir, cacheIndexFile, func(f *os.File) error {
		_, err := f.Write(b)
		return err
	})
}

// memo records that the manifest memo file (relative to the cache
// directory) describes a module compiled as key, so that pruning key
// deletes it too. A key the index does not know (its compile was a hit on
// files it cannot attribute) keeps its memo for ever, as it keeps them.
func (c *cacheDir) memo(key, file string) {
	c.compileMu.Lock()
	defer c.compileMu.Unlock()
	idx := c.read()
	e := idx[key]
	if e == nil || slices.Contains(e.Memos, file) {
		return
	}
	e.Memos = append(e.Memos, file)
	if err := c.write(idx); err != nil {
		c.log.Warn("compiled-code cache index not written", "dir", c.dir, "err", err)
	}
}

// acquire marks key as loaded; the function it returns releases it (once).
func (c *cacheDir) acquire(key string) func() {
	c.mu.Lock()
	c.live[key]++
	c.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.live[key]--; c.live[key] <= 0 {
				delete(c.live, key)
			}
		})
	}
}
