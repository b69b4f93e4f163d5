package abi_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
)

const validManifest = `{
  "abi_version": 1,
  "module": {"name": "shop", "version": "1.0.0"},
  "messages": [
    {"type": "PlaceOrder", "kind": "command", "category": "order", "fields": [{"name": "order_id", "type": "string"}, {"name": "client_id"}]},
    {"type": "OrderPlaced", "kind": "event", "category": "order", "fields": [{"name": "order_id"}, {"name": "client_id"}]},
    {"type": "PaymentRecorded", "kind": "event", "category": "payment", "fields": [{"name": "order_id"}]}
  ],
  "handlers": [
    {"name": "orders", "kind": "command_handler", "category": "order", "handles": ["PlaceOrder"]},
    {"name": "client_orders", "kind": "projector", "category": "order", "handles": ["OrderPlaced"], "sequential_by": "client_id"},
    {"name": "fulfillment", "kind": "process_manager", "handles": ["PaymentRecorded"], "correlate": {"PaymentRecorded": "order_id"}, "sequential_by": true}
  ]
}`

func TestDecodeManifestValid(t *testing.T) {
	m, err := abi.DecodeManifest([]byte(validManifest))
	require.NoError(t, err)
	require.Equal(t, "shop", m.Module.Name)
	require.Equal(t, abi.SequentialBy{Field: "client_id"}, m.Handlers[1].SequentialBy)
	require.Equal(t, abi.SequentialBy{Correlation: true}, m.Handlers[2].SequentialBy)
	require.True(t, m.Handlers[0].SequentialBy.IsZero())
	msg, ok := m.Message("OrderPlaced")
	require.True(t, ok)
	require.True(t, msg.HasField("client_id"))

	// Round trip: what we encode we decode to the same thing.
	b, err := json.Marshal(m)
	require.NoError(t, err)
	m2, err := abi.DecodeManifest(b)
	require.NoError(t, err)
	require.Equal(t, m, m2)
}

func TestDecodeManifestRejects(t *testing.T) {
	edit := func(old, new string) string {
		require.Contains(t, validManifest, old)
		return strings.Replace(validManifest, old, new, 1)
	}
	tests := []struct{ name, in, want string }{
		{"not json", `{"abi_version": 1,`, "unexpected EOF"},
		{"trailing data", validManifest + `{}`, "trailing data"},
		{"unknown key", edit(`"abi_version": 1,`, `"abi_version": 1, "extra": 1,`), `unknown field "extra"`},
		{"no abi version", edit(`"abi_version": 1,`, ``), "abi_version is missing"},
		{"bad module name", edit(`"name": "shop"`, `"name": "sh op"`), `module.name "sh op"`},
		{"no module version", edit(`"version": "1.0.0"`, `"version": ""`), "module.version"},
		{"bad kind", edit(`"kind": "projector"`, `"kind": "saga"`), `handler client_orders: unknown kind "saga"`},
		{"bad message kind", edit(`"kind": "command"`, `"kind": "query"`), `message PlaceOrder: kind "query"`},
		{"category with dash", edit(`"category": "payment", "fields"`, `"category": "pay-ment", "fields"`), `category "pay-ment"`},
		{"category with colon", edit(`"category": "payment", "fields"`, `"category": "pay:ment", "fields"`), `category "pay:ment"`},
		{"undeclared type", edit(`"handles": ["OrderPlaced"]`, `"handles": ["OrderShipped"]`), "handles OrderShipped, which the module does not declare"},
		{"projector handles a command", edit(`"handles": ["OrderPlaced"]`, `"handles": ["PlaceOrder"]`), "a projector handles events, but PlaceOrder is a command"},
		{"category mismatch", edit(`"category": "order", "handles": ["OrderPlaced"]`, `"category": "payment", "handles": ["OrderPlaced"]`), `handles OrderPlaced of category "order"`},
		{"pm without correlate", edit(`"correlate": {"PaymentRecorded": "order_id"}, `, ``), "has no correlate field for PaymentRecorded"},
		{"pm with category", edit(`"kind": "process_manager",`, `"kind": "process_manager", "category": "payment",`), "category must be empty"},
		{"pm with a field key", edit(`"sequential_by": true`, `"sequential_by": "order_id"`), "must be true or absent"},
		{"true on a projector", edit(`"sequential_by": "client_id"`, `"sequential_by": true`), "sequential_by = true is for process managers"},
		{"empty key", edit(`"sequential_by": "client_id"`, `"sequential_by": ""`), "must not be an empty string"},
		{"numeric key", edit(`"sequential_by": "client_id"`, `"sequential_by": 7`), "must be a field name, true, or null"},
		{"documents by key without a key", edit(`"handles": ["PlaceOrder"]}`, `"handles": ["PlaceOrder"], "documents_by_key": true}`), "documents_by_key is for a projector with a sequential_by field"},
		{"documents by key unpartitioned", edit(`"sequential_by": "client_id"}`, `"documents_by_key": true}`), "documents_by_key is for a projector with a sequential_by field"},
		{"duplicate handler", edit(`"name": "orders"`, `"name": "client_orders"`), "handler client_orders is declared twice"},
		{"duplicate field", edit(`[{"name": "order_id"}, {"name": "client_id"}]`, `[{"name": "order_id"}, {"name": "order_id"}]`), "field order_id is declared twice"},
		{"no handlers", `{"abi_version": 1, "module": {"name": "m", "version": "1"}, "messages": [], "handlers": []}`, "declares no handlers"},
		{"too large", `{"x": "` + strings.Repeat("a", abi.MaxManifestBytes) + `"}`, "exceeds the 1048576-byte limit"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := abi.DecodeManifest([]byte(tc.in))
			require.ErrorIs(t, err, abi.ErrManifest)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestDecodeHandleResponse(t *testing.T) {
	ok := `{"effects": {"events": [{"stream": "order-o-1", "type": "OrderPlaced", "data": {"a": 1}, "expected_version": -1}],
		"writes": [{"kind": "aggregate", "type": "order", "id": "o-1", "expected_version": 0, "data": {"s": "x"}}]}}`
	fail := `{"error": {"kind": "transient", "message": "db down"}}`
	r, err := abi.DecodeHandleResponse([]byte(`{"results": [`+ok+`,`+fail+`]}`), 2, 1<<20)
	require.NoError(t, err)
	require.Len(t, r.Results, 2)
	require.True(t, r.Results[1].Error.Kind.Retryable())

	// A short response must end with an error.
	_, err = abi.DecodeHandleResponse([]byte(`{"results": [`+fail+`]}`), 3, 1<<20)
	require.NoError(t, err)

	tests := []struct {
		name, in string
		n        int
		want     string
	}{
		{"short without error", `{"results": [` + ok + `]}`, 2, "the last is not an error"},
		{"too many", `{"results": [` + ok + `,` + ok + `]}`, 1, "2 results for 1 messages"},
		{"none", `{"results": []}`, 1, "no results"},
		{"both", `{"results": [{"effects": {}, "error": {"kind": "permanent", "message": "x"}}]}`, 1, "both effects and error"},
		{"bad error kind", `{"results": [{"error": {"kind": "maybe", "message": "x"}}]}`, 1, `error kind "maybe"`},
		{"bad stream", `{"results": [{"effects": {"events": [{"stream": "order", "type": "T", "data": {}}]}}]}`, 1, "must be {category}-{id}"},
		{"event data not object", `{"results": [{"effects": {"events": [{"stream": "order-1", "type": "T", "data": [1]}]}}]}`, 1, "data must be a JSON object"},
		{"expected version below -1", `{"results": [{"effects": {"events": [{"stream": "order-1", "type": "T", "data": {}, "expected_version": -5}]}}]}`, 1, "must be >= -1"},
		{"bad write kind", `{"results": [{"effects": {"writes": [{"kind": "file", "type": "t", "id": "1", "expected_version": 0, "data": {}}]}}]}`, 1, `writes[0].kind "file"`},
		{"negative write version", `{"results": [{"effects": {"writes": [{"kind": "aggregate", "type": "t", "id": "1", "expected_version": -1, "data": {}}]}}]}`, 1, "must be >= 0"},
		{"empty write id", `{"results": [{"effects": {"writes": [{"kind": "aggregate", "type": "t", "id": "", "expected_version": 0, "data": {}}]}}]}`, 1, "writes[0].id: empty"},
		{"over limit", `{"results": [` + ok + `]}`, 1, "exceeds the 10-byte limit"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			limit := 1 << 20
			if tc.name == "over limit" {
				limit = 10
			}
			_, err := abi.DecodeHandleResponse([]byte(tc.in), tc.n, limit)
			require.ErrorIs(t, err, abi.ErrResponse)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestSplitStream(t *testing.T) {
	cat, id, err := abi.SplitStream("order-a-b")
	require.NoError(t, err)
	require.Equal(t, "order", cat)
	require.Equal(t, "a-b", id)
	for _, bad := range []string{"", "order", "-x", "order-", "Order-1", "or:der-1"} {
		_, _, err := abi.SplitStream(bad)
		require.Error(t, err, bad)
	}
}

func TestHostRequests(t *testing.T) {
	r, err := abi.DecodeLoadRequest([]byte(`{"kind": "projection", "type": "client_orders", "id": "c-1"}`))
	require.NoError(t, err)
	require.Equal(t, abi.RecordProjection, r.Kind)
	for _, bad := range []string{`{"kind": "x", "type": "t", "id": "1"}`, `{"kind": "aggregate", "type": "", "id": "1"}`, `{"kind": "aggregate", "type": "t", "id": ""}`, `[]`, `{"kind": "aggregate", "type": "t", "id": "1", "z": 1}`} {
		_, err := abi.DecodeLoadRequest([]byte(bad))
		require.ErrorIs(t, err, abi.ErrResponse, bad)
	}
	s, err := abi.DecodeReadStreamRequest([]byte(`{"stream": "order-o-1", "from": 0, "limit": 10}`))
	require.NoError(t, err)
	require.Equal(t, "order-o-1", s.Stream)
	for _, bad := range []string{`{"stream": "order", "from": 0}`, `{"stream": "order-1", "from": -1}`, `{"stream": "order-1", "limit": -1}`} {
		_, err := abi.DecodeReadStreamRequest([]byte(bad))
		require.ErrorIs(t, err, abi.ErrResponse, bad)
	}
}

func TestHostErrorKinds(t *testing.T) {
	tests := []struct {
		kind      abi.HostErrorKind
		retryable bool
		handler   abi.ErrorKind
	}{
		{abi.HostScope, false, abi.ErrorPermanent},
		{abi.HostInvalid, false, abi.ErrorPermanent},
		{abi.HostNotFound, false, abi.ErrorPermanent},
		{abi.HostConflict, true, abi.ErrorTransient},
		{abi.HostTransient, true, abi.ErrorTransient},
		{"", true, abi.ErrorTransient},        // an older host
		{"someday", true, abi.ErrorTransient}, // a newer host
	}
	for _, tc := range tests {
		require.Equal(t, tc.retryable, tc.kind.Retryable(), "%q", tc.kind)
		require.Equal(t, tc.handler, tc.kind.HandlerKind(), "%q", tc.kind)
	}
	// A response of an older host, without error_kind, still decodes, and
	// a response without an error carries no error_kind.
	var old abi.LoadResponse
	require.NoError(t, json.Unmarshal([]byte(`{"found":false,"version":0,"error":"boom"}`), &old))
	require.Equal(t, abi.HostErrorKind(""), old.ErrorKind)
	b, err := json.Marshal(abi.ReadStreamResponse{Messages: []abi.Envelope{}})
	require.NoError(t, err)
	require.JSONEq(t, `{"messages":[]}`, string(b))
	b, err = json.Marshal(abi.LoadResponse{Error: "out of scope", ErrorKind: abi.HostScope})
	require.NoError(t, err)
	require.JSONEq(t, `{"found":false,"version":0,"error":"out of scope","error_kind":"scope"}`, string(b))
}
