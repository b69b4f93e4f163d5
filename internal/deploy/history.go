package deploy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/proteanhq/protean-host/internal/atomicfile"
)

// History: DIR/.history/NAME/<unix-nanos>-<sha256 prefix>.wasm, one file
// per earlier version, the newest with the greatest time.

// Version is one earlier version of a module.
type Version struct {
	SHA256 string    `json:"sha256"`
	At     time.Time `json:"at"` // when it was replaced
	Size   int64     `json:"size"`
	path   string
}

// ModuleInfo is a module of the plugins directory and its history.
type ModuleInfo struct {
	Name     string    `json:"name"`
	Tenant   string    `json:"tenant"`
	SHA256   string    `json:"sha256,omitempty"` // "" for a removed module with history
	Size     int64     `json:"size"`
	Modified time.Time `json:"modified,omitzero"`
	History  []Version `json:"history"` // newest first
}

func (d *Deployer) historyDir(name string) string {
	return filepath.Join(d.o.Dir, HistoryDir, name)
}

// keep writes b into the module's history and returns its path.
func (d *Deployer) keep(name string, b []byte) (string, error) {
	dir := d.historyDir(name)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return "", fmt.Errorf("module %s: history: %w", name, err)
	}
	vs, err := d.history(name)
	if err != nil {
		return "", err
	}
	// Each version is stamped after the last, even within one tick of the
	// clock (or a clock set back), so the order of history is the order
	// of the deploys.
	at := d.o.Now().UnixNano()
	if n := len(vs); n > 0 && at <= vs[n-1].At.UnixNano() {
		at = vs[n-1].At.UnixNano() + 1
	}
	p := filepath.Join(dir, fmt.Sprintf("%d-%s.wasm", at, sum(b)[:12]))
	if err := atomicfile.WriteFile(p, b, 0o644); err != nil {
		return "", fmt.Errorf("module %s: history: %w", name, err)
	}
	return p, nil
}

// history lists the module's earlier versions, oldest first.
func (d *Deployer) history(name string) ([]Version, error) {
	dir := d.historyDir(name)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("module %s: history: %w", name, err)
	}
	type stamped struct {
		nanos int64
		v     Version
	}
	var vs []stamped
	for _, e := range entries {
		stamp, _, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".wasm"), "-")
		nanos, err := strconv.ParseInt(stamp, 10, 64)
		if !ok || err != nil || !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), ".wasm") {
			continue // not one of ours (a temporary file of a kept version)
		}
		p := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("module %s: history: %w", name, err)
		}
		vs = append(vs, stamped{nanos, Version{SHA256: sum(b), At: time.Unix(0, nanos).UTC(), Size: int64(len(b)), path: p}})
	}
	slices.SortFunc(vs, func(a, b stamped) int { return cmp.Compare(a.nanos, b.nanos) })
	out := make([]Version, len(vs))
	for i, s := range vs {
		out[i] = s.v
	}
	return out, nil
}

// prune keeps the newest Keep versions of the module's history.
func (d *Deployer) prune(name string) {
	vs, err := d.history(name)
	if err != nil {
		d.o.Logger.Warn("deploy: history not pruned", "module", name, "error", err)
		return
	}
	for len(vs) > d.o.Keep {
		if err := os.Remove(vs[0].path); err != nil {
			d.o.Logger.Warn("deploy: history version not pruned", "module", name, "path", vs[0].path, "error", err)
		}
		vs = vs[1:]
	}
}

// List returns the modules of tenants (nil: every tenant) in the plugins
// directory, by name, with their history; a module removed by a deploy
// is listed while it has history.
func (d *Deployer) List(ctx context.Context, tenants []string) ([]ModuleInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	names := map[string]bool{}
	entries, err := os.ReadDir(d.o.Dir)
	if err != nil {
		return nil, fmt.Errorf("plugins directory %s: %w", d.o.Dir, err)
	}
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".wasm"); ok && e.Type().IsRegular() {
			names[n] = true
		}
	}
	kept, err := os.ReadDir(filepath.Join(d.o.Dir, HistoryDir))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("plugins directory %s: history: %w", d.o.Dir, err)
	}
	for _, e := range kept {
		if _, err := CheckName(e.Name()); err == nil && e.IsDir() {
			names[e.Name()] = true
		}
	}
	out := []ModuleInfo{}
	for _, n := range slices.Sorted(maps.Keys(names)) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		tenant := d.TenantOf(n)
		if tenants != nil && !slices.Contains(tenants, tenant) {
			continue
		}
		info, err := d.info(n, tenant)
		if err != nil {
			return nil, err
		}
		if info.SHA256 != "" || len(info.History) > 0 {
			out = append(out, info)
		}
	}
	return out, nil
}

func (d *Deployer) info(name, tenant string) (ModuleInfo, error) {
	info := ModuleInfo{Name: name, Tenant: tenant, History: []Version{}}
	if fi, err := os.Lstat(d.path(name)); err == nil && fi.Mode().IsRegular() {
		b, err := os.ReadFile(d.path(name))
		if err != nil {
			return ModuleInfo{}, fmt.Errorf("module %s: %w", name, err)
		}
		info.SHA256, info.Size, info.Modified = sum(b), int64(len(b)), fi.ModTime().UTC()
	}
	vs, err := d.history(name)
	if err != nil {
		return ModuleInfo{}, err
	}
	for i := len(vs) - 1; i >= 0; i-- {
		info.History = append(info.History, vs[i])
	}
	return info, nil
}
