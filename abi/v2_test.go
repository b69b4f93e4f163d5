package abi_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
)

func ptr[T any](v T) *T { return &v }

var sampleResponse = abi.HandleResponse{Results: []abi.Result{
	{Effects: &abi.Effects{
		Events: []abi.NewEvent{
			{Stream: "order-o-1", Type: "OrderShipped", Data: json.RawMessage(`{"order_id":"o-1"}`), ExpectedVersion: ptr(int64(5)), ID: "e-1"},
			{Stream: "order-o-1", Type: "OrderNoted", Data: json.RawMessage(`{}`)},
		},
		Writes: []abi.Write{
			{Kind: abi.RecordProjection, Type: "client_orders", ID: "c-1", ExpectedVersion: 3, Data: json.RawMessage(`{"orders":4}`)},
			{Kind: abi.RecordAggregate, Type: "order", ID: "o-2", ExpectedVersion: 7}, // a delete
		},
		Commands: []abi.NewCommand{{Type: "ShipOrder", Data: json.RawMessage(`{"order_id":"o-1"}`)}},
	}},
	{},
	{Error: &abi.Error{Kind: abi.ErrorRejected, Message: "no"}},
}}

var sampleRequest = abi.HandleRequest{Handler: "client_orders", Messages: []abi.Envelope{
	{ID: "0c9", Type: "OrderPlaced", Stream: "order-o-1", Position: 0, GlobalPosition: 17,
		Time: time.Date(2026, 11, 30, 10, 0, 0, 123, time.UTC), Data: json.RawMessage(`{"order_id":"o-1"}`),
		Metadata: &abi.Metadata{CorrelationID: "c", CausationID: "d", Tenant: "t"}},
	{ID: "1", Type: "Cmd"},
}}

func TestV2RoundTrip(t *testing.T) {
	b := abi.AppendHandleResponseV2(nil, &sampleResponse)
	got, err := abi.DecodeHandleResponseV2(b, 3, abi.DefaultMaxOutputBytes)
	require.NoError(t, err)
	require.Equal(t, &sampleResponse, got)

	rb := abi.AppendHandleRequestV2(nil, &sampleRequest)
	req, err := abi.DecodeHandleRequestV2(rb)
	require.NoError(t, err)
	require.Equal(t, &sampleRequest, req)
}

// The byte layout of v2.md, pinned: a C module is written against it.
func TestV2Layout(t *testing.T) {
	b := abi.AppendHandleResponseV2(nil, &abi.HandleResponse{Results: []abi.Result{
		{Effects: &abi.Effects{Writes: []abi.Write{{Kind: abi.RecordProjection, Type: "p", ID: "i", ExpectedVersion: 2, Data: json.RawMessage(`{}`)}}}},
		{Error: &abi.Error{Kind: abi.ErrorTransient, Message: "x"}},
	}})
	require.Equal(t, []byte{
		2, 0, 0, 0, // two results
		1,          // effects
		0, 0, 0, 0, // no events
		1, 0, 0, 0, // one write
		2,               // projection
		1, 0, 0, 0, 'p', // type
		1, 0, 0, 0, 'i', // id
		2, 0, 0, 0, 0, 0, 0, 0, // expected_version
		2, 0, 0, 0, '{', '}', // data
		0, 0, 0, 0, // no commands
		2, 1, // error, transient
		1, 0, 0, 0, 'x',
	}, b)
}

func TestV2Rejects(t *testing.T) {
	good := abi.AppendHandleResponseV2(nil, &sampleResponse)
	for _, tc := range []struct {
		name string
		b    []byte
		n    int
		want string
	}{
		{"truncated", good[:len(good)-1], 3, "short input"},
		{"trailing", append(append([]byte{}, good...), 0), 3, "trailing bytes"},
		{"huge count", []byte{0xff, 0xff, 0xff, 0xff}, 3, "count 4294967295 exceeds the input"},
		{"bad tag", []byte{1, 0, 0, 0, 9}, 1, "result tag"},
		{"bad error kind", []byte{1, 0, 0, 0, 2, 7, 0, 0, 0, 0}, 1, "error kind code 7"},
		{"invalid json", abi.AppendHandleResponseV2(nil, &abi.HandleResponse{Results: []abi.Result{{Effects: &abi.Effects{
			Commands: []abi.NewCommand{{Type: "C", Data: json.RawMessage(`{"a":`)}}}}}}), 1, "commands[0].data is not valid JSON"},
		{"invalid utf-8", abi.AppendHandleResponseV2(nil, &abi.HandleResponse{Results: []abi.Result{{Effects: &abi.Effects{
			Writes: []abi.Write{{Kind: abi.RecordProjection, Type: "p", ID: "\xff", Data: json.RawMessage(`{}`)}}}}}}), 1, "not valid UTF-8"},
		{"too many results", good, 2, "3 results for 2 messages"},
		{"over the limit", good, 3, "exceeds the 10-byte limit"},
	} {
		limit := abi.DefaultMaxOutputBytes
		if tc.name == "over the limit" {
			limit = 10
		}
		_, err := abi.DecodeHandleResponseV2(tc.b, tc.n, limit)
		require.ErrorIs(t, err, abi.ErrResponse, tc.name)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
}

// A v2 response the host accepts means what its JSON form means to the
// v1 decoder, and re-encodes to the same bytes.
func FuzzDecodeHandleResponseV2(f *testing.F) {
	f.Add(abi.AppendHandleResponseV2(nil, &sampleResponse), 3)
	f.Add([]byte{1, 0, 0, 0, 0}, 1)
	f.Add([]byte{1, 0, 0, 0, 2, 1, 1, 0, 0, 0, 'x'}, 2)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		n = n%8 + 1
		if n < 1 {
			n += 8
		}
		raw, rawErr := abi.DecodeResultsV2(b)
		r, err := abi.DecodeHandleResponseV2(b, n, abi.DefaultMaxOutputBytes)
		if rawErr != nil {
			require.Error(t, err, "the checked decoder accepts what the raw one refuses")
			return
		}
		// Round trip: encode, decode, encode again; the same both times.
		enc := abi.AppendHandleResponseV2(nil, raw)
		again, err2 := abi.DecodeResultsV2(enc)
		require.NoError(t, err2)
		require.Equal(t, enc, abi.AppendHandleResponseV2(nil, again))
		if err != nil {
			return
		}
		js, jerr := json.Marshal(r)
		require.NoError(t, jerr, "an accepted v2 response has a JSON form")
		v1, jerr := abi.DecodeHandleResponse(js, n, abi.DefaultMaxOutputBytes)
		require.NoError(t, jerr, "the v1 decoder refuses what v2 accepted: %s", js)
		js1, _ := json.Marshal(v1)
		require.JSONEq(t, string(js), string(js1))
	})
}

func FuzzDecodeHandleRequestV2(f *testing.F) {
	f.Add(abi.AppendHandleRequestV2(nil, &sampleRequest))
	f.Add(abi.AppendLoadRequestV2(nil, &abi.LoadRequest{Kind: abi.RecordAggregate, Type: "order", ID: "o-1"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if req, err := abi.DecodeHandleRequestV2(b); err == nil {
			enc := abi.AppendHandleRequestV2(nil, req)
			again, err := abi.DecodeHandleRequestV2(enc)
			require.NoError(t, err)
			require.Equal(t, req, again)
		}
		// The host-function codecs on the same bytes: never a panic, and
		// a stable round trip.
		if lr, err := abi.DecodeLoadRequestV2(b); err == nil {
			again, err := abi.DecodeLoadRequestV2(abi.AppendLoadRequestV2(nil, lr))
			require.NoError(t, err)
			require.Equal(t, lr, again)
		}
		if resp, err := abi.DecodeLoadResponseV2(b); err == nil {
			again, err := abi.DecodeLoadResponseV2(abi.AppendLoadResponseV2(nil, resp))
			require.NoError(t, err)
			if resp.Error == "" {
				require.Equal(t, resp, again)
			}
		}
		if rs, err := abi.DecodeReadStreamResponseV2(b); err == nil {
			again, err := abi.DecodeReadStreamResponseV2(abi.AppendReadStreamResponseV2(nil, rs))
			require.NoError(t, err)
			if rs.Error == "" {
				require.Equal(t, rs, again)
			}
		}
		_, _ = abi.DecodeReadStreamRequestV2(b)
	})
}
