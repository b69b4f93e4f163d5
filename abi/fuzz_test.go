package abi_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/proteanhq/protean-host/abi"
)

// The decoders take bytes a guest wrote: they must never panic, and what
// they accept must re-encode and decode to the same value. "The same" is
// compared on the encodings (encode, decode, encode again: the two
// encodings are equal), since json.RawMessage fields come back compacted.

// sameEncoding fails t unless v, decoded from first, encodes to first.
func sameEncoding(t *testing.T, first []byte, v any) {
	t.Helper()
	again, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("decoded value does not encode: %v", err)
	}
	if !bytes.Equal(first, again) {
		t.Fatalf("round trip changed the value:\nfirst:  %s\nsecond: %s", first, again)
	}
}

func FuzzDecodeManifest(f *testing.F) {
	f.Add([]byte(validManifest))
	f.Add([]byte(`{"abi_version": 1, "module": {"name": "m", "version": "1"}, "handlers": [{"name": "h", "kind": "process_manager", "handles": ["E"], "correlate": {"E": "f"}, "sequential_by": true}], "messages": [{"type": "E", "kind": "event", "category": "c", "fields": []}]}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"sequential_by": false}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := abi.DecodeManifest(b)
		if err != nil {
			return
		}
		out, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("accepted manifest does not encode: %v", err)
		}
		m2, err := abi.DecodeManifest(out)
		if err != nil {
			t.Fatalf("re-encoded manifest rejected: %v\n%s", err, out)
		}
		sameEncoding(t, out, m2)
	})
}

func FuzzDecodeHandleResponse(f *testing.F) {
	f.Add([]byte(`{"results": [{"effects": {"events": [{"stream": "order-o-1", "type": "OrderPlaced", "data": {}}]}}]}`), 1)
	f.Add([]byte(`{"results": [{"error": {"kind": "transient", "message": "x"}}]}`), 3)
	f.Add([]byte(`{"results": [{"effects": {"writes": [{"kind": "aggregate", "type": "t", "id": "1", "expected_version": 0, "data": null}]}}]}`), 1)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		if n < 0 || n > 1000 {
			return
		}
		r, err := abi.DecodeHandleResponse(b, n, 1<<20)
		if err != nil {
			return
		}
		if len(r.Results) > n || (n > 0 && len(r.Results) == 0) {
			t.Fatalf("accepted %d results for %d messages", len(r.Results), n)
		}
		out, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("accepted response does not encode: %v", err)
		}
		r2, err := abi.DecodeHandleResponse(out, n, 1<<20)
		if err != nil {
			t.Fatalf("re-encoded response rejected: %v\n%s", err, out)
		}
		sameEncoding(t, out, r2)
	})
}

func FuzzDecodeLoadRequest(f *testing.F) {
	f.Add([]byte(`{"kind": "aggregate", "type": "order", "id": "o-1"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := abi.DecodeLoadRequest(b); err == nil && (r.ID == "" || r.Type == "") {
			t.Fatalf("accepted an empty id or type: %+v", r)
		}
	})
}

func FuzzDecodeReadStreamRequest(f *testing.F) {
	f.Add([]byte(`{"stream": "order-o-1", "from": 0, "limit": 10}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := abi.DecodeReadStreamRequest(b); err == nil && (r.From < 0 || r.Limit < 0) {
			t.Fatalf("accepted negative bounds: %+v", r)
		}
	})
}
