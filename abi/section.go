package abi

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/proteanhq/protean-host/internal/wasmbin"
)

// ManifestSection is the name of the custom section that may carry a
// module's manifest (see the package documentation, Exports).
const ManifestSection = "protean.manifest"

// Errors of the functions that read and write the section.
var (
	// ErrNotModule marks bytes that do not frame a WebAssembly module
	// (magic number, binary version 1, section sizes, custom section
	// names).
	ErrNotModule = errors.New("not a WebAssembly module")
	// ErrManifestSection marks a protean.manifest section that cannot be
	// read or written: the section twice, or a manifest over
	// MaxManifestBytes.
	ErrManifestSection = errors.New(ManifestSection + " section")
)

// EmbedManifest returns the module wasm with manifest (JSON, at most
// MaxManifestBytes) as its protean.manifest custom section: every such
// section wasm has is removed (RemoveManifest) and one is appended at the
// end, holding manifest byte for byte. Embedding again therefore gives the
// same bytes. wasm is not modified.
func EmbedManifest(wasm, manifest []byte) ([]byte, error) {
	if len(manifest) > MaxManifestBytes {
		return nil, fmt.Errorf("%w: manifest of %d bytes exceeds the %d-byte limit", ErrManifestSection, len(manifest), MaxManifestBytes)
	}
	out, err := RemoveManifest(wasm)
	if err != nil {
		return nil, err
	}
	return wasmbin.AppendCustom(out, ManifestSection, manifest), nil
}

// RemoveManifest returns a copy of the module wasm without its
// protean.manifest sections, every other section kept in order.
func RemoveManifest(wasm []byte) ([]byte, error) {
	secs, err := wasmbin.Sections(wasm)
	if err != nil {
		return nil, notModule(err)
	}
	out := make([]byte, 0, len(wasm)+64)
	out = append(out, wasm[:8]...)
	for _, s := range secs {
		name, err := sectionName(s)
		if err != nil {
			return nil, err
		}
		if name != ManifestSection {
			out = append(out, wasm[s.At:s.End]...)
		}
	}
	return out, nil
}

// SplitManifest returns the content of the module's protean.manifest
// section, not decoded, and the module without it, in one walk of its
// sections; ok is false, and without is wasm itself, if it has none. When
// the section is the module's last, as EmbedManifest puts it, without
// shares wasm's bytes (no copy); otherwise it is RemoveManifest's copy. A
// module that does not parse, or has the section twice, is an error.
func SplitManifest(wasm []byte) (manifest []byte, ok bool, without []byte, err error) {
	secs, at, manifest, err := findManifest(wasm)
	switch {
	case err != nil:
		return nil, false, nil, err
	case at < 0:
		return nil, false, wasm, nil
	case at == len(secs)-1:
		return manifest, true, wasm[:secs[at].At:secs[at].At], nil
	}
	if without, err = RemoveManifest(wasm); err != nil {
		return nil, false, nil, err
	}
	return manifest, true, without, nil
}

// EmbeddedManifest returns the content of the module's protean.manifest
// section, not decoded (see DecodeManifest); ok is false if it has none. A
// module that does not parse, or has the section twice, is an error.
func EmbeddedManifest(wasm []byte) (manifest []byte, ok bool, err error) {
	_, at, manifest, err := findManifest(wasm)
	if err != nil {
		return nil, false, err
	}
	return manifest, at >= 0, nil
}

// ManifestAt is EmbeddedManifest for the module of size bytes that r
// reads: it reads the sections' headers, the custom sections' names and
// the manifest, and nothing else (of a Go module's 4 MB, well under a
// kilobyte). A read that fails is that error.
func ManifestAt(r io.ReaderAt, size int64) (manifest []byte, ok bool, err error) {
	secs, err := wasmbin.SectionsAt(r, size)
	if err != nil {
		return nil, false, notModule(err)
	}
	for _, s := range secs {
		if s.ID != wasmbin.CustomID {
			continue
		}
		name, content, err := wasmbin.CustomNameAt(r, s)
		if err != nil {
			return nil, false, notModule(err)
		}
		if name != ManifestSection {
			continue
		}
		if ok {
			return nil, false, fmt.Errorf("%w: the module has two", ErrManifestSection)
		}
		manifest, ok = make([]byte, s.End-content), true
		if _, err := r.ReadAt(manifest, content); err != nil && !(err == io.EOF && content+int64(len(manifest)) == size) {
			return nil, false, err
		}
	}
	return manifest, ok, nil
}

// notModule marks err, a wasmbin error, ErrNotModule if it is one of the
// module's framing (not of reading it).
func notModule(err error) error {
	if errors.Is(err, wasmbin.ErrMalformed) || errors.Is(err, wasmbin.ErrVersion) {
		return fmt.Errorf("%w: %v", ErrNotModule, err)
	}
	return err
}

// findManifest walks the module's sections once: it returns them, the
// index of the protean.manifest section (-1: none) and a copy of its
// content. A module that does not parse, or has the section twice, is an
// error.
func findManifest(wasm []byte) (secs []wasmbin.Section, at int, manifest []byte, err error) {
	secs, err = wasmbin.Sections(wasm)
	if err != nil {
		return nil, -1, nil, notModule(err)
	}
	at = -1
	for i, s := range secs {
		name, err := sectionName(s)
		if err != nil {
			return nil, -1, nil, err
		}
		if name != ManifestSection {
			continue
		}
		if at >= 0 {
			return nil, -1, nil, fmt.Errorf("%w: the module has two", ErrManifestSection)
		}
		_, content, _ := wasmbin.CustomName(s.Payload)
		at, manifest = i, bytes.Clone(content)
	}
	return secs, at, manifest, nil
}

// sectionName is the name of a custom section, "" for any other.
func sectionName(s wasmbin.Section) (string, error) {
	if s.ID != wasmbin.CustomID {
		return "", nil
	}
	name, _, err := wasmbin.CustomName(s.Payload)
	if err != nil {
		return "", notModule(err)
	}
	return name, nil
}
