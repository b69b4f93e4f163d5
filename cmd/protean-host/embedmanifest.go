package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/atomicfile"
	"github.com/proteanhq/protean-host/internal/host"
)

// cmdPluginEmbedManifest writes each module's manifest, as the module
// answers it, into the module file as its protean.manifest section
// (abi.ManifestSection), so that a host start reads it there instead of
// running the module (issue 21). Each file is loaded as `plugin test` and
// validate load it (compiled, under the config's limits), from its bytes
// without the section: a stale section is replaced, not refused. The file
// is rewritten atomically with its mode kept; a file already carrying
// what it answers is left as it is, so running it twice changes nothing.
func cmdPluginEmbedManifest(ctx context.Context, e *env, args []string) error {
	fs := e.flags("plugin embed-manifest")
	if err := e.parseAuthor(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("usage: protean-host plugin embed-manifest MODULE.wasm...")
	}
	l, err := e.loader(nil, false)
	if err != nil {
		return err
	}
	defer l.Close(context.WithoutCancel(ctx))
	failed := 0
	for _, path := range fs.Args() {
		line, err := embedManifest(ctx, l, path)
		if err != nil {
			fmt.Fprintf(e.stderr, "%s: %v\n", path, err)
			failed++
			continue
		}
		fmt.Fprintln(e.stdout, line)
	}
	if failed > 0 {
		return exitError{1}
	}
	return nil
}

// embedManifest embeds the manifest of the module file path into it and
// says what it did.
func embedManifest(ctx context.Context, l *host.Loader, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	stat, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	without, err := abi.RemoveManifest(b)
	if err != nil {
		return "", err
	}
	load := path
	if len(without) != len(b) {
		// Loaded without its section, under its own file name (the limits
		// are per module name).
		dir, err := os.MkdirTemp("", "protean-embed-")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(dir)
		load = filepath.Join(dir, filepath.Base(path))
		if err := os.WriteFile(load, without, 0o600); err != nil {
			return "", err
		}
	}
	m, err := l.LoadFile(ctx, load)
	if err != nil {
		return "", err
	}
	raw, man := m.ManifestJSON(), m.Manifest
	_ = m.Close(context.WithoutCancel(ctx))
	out, err := abi.EmbedManifest(without, raw)
	if err != nil {
		return "", err
	}
	what := fmt.Sprintf("%s: %s %s: %s section of %d bytes", path, man.Module.Name, man.Module.Version, abi.ManifestSection, len(raw))
	if bytes.Equal(out, b) {
		return what + " already embedded", nil
	}
	if err := atomicfile.WriteFile(path, out, stat.Mode().Perm()); err != nil {
		return "", err
	}
	return what + " embedded", nil
}
