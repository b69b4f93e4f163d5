package abi_test

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
)

// tinyModule is a module of a type section ([] -> []) and a custom
// section "other" before and after it: what embedding must keep.
var tinyModule = []byte{
	0, 'a', 's', 'm', 1, 0, 0, 0,
	0, 6, 5, 'o', 't', 'h', 'e', 'r', // custom "other", empty
	1, 4, 1, 0x60, 0, 0, // type section
	0, 7, 5, 'o', 't', 'h', 'e', 'r', 'x', // custom "other", "x"
}

func TestEmbedManifestRoundTrip(t *testing.T) {
	t.Parallel()
	out, err := abi.EmbedManifest(tinyModule, []byte(validManifest))
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(out, tinyModule), "the module's sections are kept, in order, before the manifest")
	got, ok, err := abi.EmbeddedManifest(out)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, validManifest, string(got), "the section holds the manifest byte for byte")
	_, err = abi.DecodeManifest(got)
	require.NoError(t, err)
}

func TestEmbedManifestTwiceReplaces(t *testing.T) {
	t.Parallel()
	once, err := abi.EmbedManifest(tinyModule, []byte(`{"a":1}`))
	require.NoError(t, err)
	again, err := abi.EmbedManifest(once, []byte(`{"a":1}`))
	require.NoError(t, err)
	require.Equal(t, once, again, "embedding the same manifest again is idempotent")

	other, err := abi.EmbedManifest(once, []byte(`{"b":2}`))
	require.NoError(t, err)
	got, ok, err := abi.EmbeddedManifest(other)
	require.NoError(t, err, "one section, not two")
	require.True(t, ok)
	require.Equal(t, `{"b":2}`, string(got))
	require.Len(t, other, len(once), "the old section was replaced, not kept")

	removed, err := abi.RemoveManifest(other)
	require.NoError(t, err)
	require.Equal(t, tinyModule, removed)
}

func TestEmbeddedManifestAbsent(t *testing.T) {
	t.Parallel()
	got, ok, err := abi.EmbeddedManifest(tinyModule)
	require.NoError(t, err)
	require.False(t, ok)
	require.Nil(t, got)
}

func TestEmbeddedManifestRefusesTwoSections(t *testing.T) {
	t.Parallel()
	once, err := abi.EmbedManifest(tinyModule, []byte(`{}`))
	require.NoError(t, err)
	twice := append(once[:len(once):len(once)], once[len(tinyModule):]...)
	_, _, err = abi.EmbeddedManifest(twice)
	require.ErrorIs(t, err, abi.ErrManifestSection)
	require.ErrorContains(t, err, "two")
}

func TestManifestSectionMalformed(t *testing.T) {
	t.Parallel()
	for name, b := range map[string][]byte{
		"empty":            nil,
		"not wasm":         []byte("{\"abi_version\": 1}"),
		"version 2":        {0, 'a', 's', 'm', 2, 0, 0, 0},
		"section overruns": append(bytes.Clone(tinyModule[:8]), 1, 9, 1, 0x60),
		"size cut short":   append(bytes.Clone(tinyModule[:8]), 1, 0x80),
		"custom name overruns": append(bytes.Clone(tinyModule[:8]),
			0, 3, 9, 'p', 'r'),
		"custom name not UTF-8": append(bytes.Clone(tinyModule[:8]),
			0, 3, 2, 0xff, 0xfe),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, _, err := abi.EmbeddedManifest(b)
			require.ErrorIs(t, err, abi.ErrNotModule)
			_, err = abi.EmbedManifest(b, []byte(`{}`))
			require.ErrorIs(t, err, abi.ErrNotModule)
			_, err = abi.RemoveManifest(b)
			require.ErrorIs(t, err, abi.ErrNotModule)
		})
	}
}

func TestEmbedManifestTooLarge(t *testing.T) {
	t.Parallel()
	_, err := abi.EmbedManifest(tinyModule, []byte(strings.Repeat(" ", abi.MaxManifestBytes+1)))
	require.ErrorIs(t, err, abi.ErrManifestSection)
	require.ErrorContains(t, err, "limit")
	_, err = abi.EmbedManifest(tinyModule, []byte(strings.Repeat(" ", abi.MaxManifestBytes)))
	require.NoError(t, err, "the limit itself is allowed")
}

// FuzzEmbeddedManifest: the section reader takes a module's bytes, which
// anyone may have written. It must not panic, and a manifest it finds
// must come back the same after embedding it again.
func FuzzEmbeddedManifest(f *testing.F) {
	f.Add(tinyModule)
	once, err := abi.EmbedManifest(tinyModule, []byte(validManifest))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(once)
	f.Fuzz(func(t *testing.T, b []byte) {
		man, ok, err := abi.EmbeddedManifest(b)
		if err != nil || !ok || len(man) > abi.MaxManifestBytes {
			return
		}
		again, err := abi.EmbedManifest(b, man)
		if err != nil {
			t.Fatalf("a module with a readable section does not embed: %v", err)
		}
		got, ok, err := abi.EmbeddedManifest(again)
		if err != nil || !ok || !bytes.Equal(got, man) {
			t.Fatalf("embedding again changed the manifest: %q, %t, %v; want %q", got, ok, err, man)
		}
	})
}

func TestSplitManifest(t *testing.T) {
	t.Parallel()
	embedded, err := abi.EmbedManifest(tinyModule, []byte(`{"a":1}`))
	require.NoError(t, err)

	got, ok, without, err := abi.SplitManifest(embedded)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, `{"a":1}`, string(got))
	require.Equal(t, tinyModule, without)
	require.Same(t, &embedded[0], &without[0], "a trailing section is cut off, not copied")
	require.Equal(t, len(without), cap(without), "appending to the module without it cannot write over the section")

	// The section in the middle: the rest is copied, in order.
	middle := append(bytes.Clone(tinyModule[:8]), embedded[len(tinyModule):]...)
	middle = append(middle, tinyModule[8:]...)
	got, ok, without, err = abi.SplitManifest(middle)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, `{"a":1}`, string(got))
	require.Equal(t, tinyModule, without)

	got, ok, without, err = abi.SplitManifest(tinyModule)
	require.NoError(t, err)
	require.False(t, ok)
	require.Nil(t, got)
	require.Equal(t, tinyModule, without, "a module without the section is returned as it is")

	twice := append(embedded[:len(embedded):len(embedded)], embedded[len(tinyModule):]...)
	_, _, _, err = abi.SplitManifest(twice)
	require.ErrorIs(t, err, abi.ErrManifestSection)
	_, _, _, err = abi.SplitManifest([]byte("{}"))
	require.ErrorIs(t, err, abi.ErrNotModule)
}

// sameManifestAt requires ManifestAt, reading b through an io.ReaderAt,
// to answer as EmbeddedManifest does on b.
func sameManifestAt(t *testing.T, b []byte) {
	t.Helper()
	want, wantOK, wantErr := abi.EmbeddedManifest(b)
	got, ok, err := abi.ManifestAt(bytes.NewReader(b), int64(len(b)))
	require.Equal(t, wantErr, err)
	require.Equal(t, wantOK, ok)
	require.Equal(t, want, got)
}

func TestManifestAt(t *testing.T) {
	t.Parallel()
	embedded, err := abi.EmbedManifest(tinyModule, []byte(`{"a":1}`))
	require.NoError(t, err)
	empty, err := abi.EmbedManifest(tinyModule, nil)
	require.NoError(t, err)
	middle := append(bytes.Clone(tinyModule[:8]), embedded[len(tinyModule):]...)
	middle = append(middle, tinyModule[8:]...)
	twice := append(bytes.Clone(embedded), embedded[len(tinyModule):]...)
	for _, b := range [][]byte{embedded, empty, middle, tinyModule, twice, []byte("{}"), nil,
		embedded[:len(embedded)-1], append(bytes.Clone(tinyModule), 0, 2, 5, 'a')} {
		sameManifestAt(t, b)
	}
	_, _, err = abi.ManifestAt(bytes.NewReader(twice), int64(len(twice)))
	require.ErrorIs(t, err, abi.ErrManifestSection)
	_, _, err = abi.ManifestAt(bytes.NewReader(embedded[:9]), int64(len(embedded)))
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "a file that shrank while read: a read error, not a bad module")
	require.NotErrorIs(t, err, abi.ErrNotModule)
}

func FuzzManifestAt(f *testing.F) {
	embedded, err := abi.EmbedManifest(tinyModule, []byte(`{"a":1}`))
	require.NoError(f, err)
	f.Add(embedded)
	f.Add(tinyModule)
	f.Fuzz(sameManifestAt)
}
