package pdk

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
)

type placed struct {
	OrderID  string  `json:"order_id"`
	ClientID string  `json:"client_id,omitempty"`
	Total    float64 `json:"total"`
	Tags     []string
	skipped  int
	Ignored  int `json:"-"`
	embedded
}

type embedded struct {
	Note string `json:"note"`
}

type counter struct {
	N   int      `json:"n"`
	IDs []string `json:"ids"`
}

// fakeHost serves loads from a map, as committed state.
type fakeHost struct {
	records map[string]abi.LoadResponse
	loads   int
	logs    []string
}

func (h *fakeHost) load(req []byte) []byte {
	h.loads++
	var r abi.LoadRequest
	if err := json.Unmarshal(req, &r); err != nil {
		panic(err)
	}
	b, _ := json.Marshal(h.records[string(r.Kind)+"/"+r.Type+"/"+r.ID])
	return b
}

func (h *fakeHost) readStream([]byte) []byte { return []byte(`{"error": "no streams here"}`) }
func (h *fakeHost) log(level, msg string)    { h.logs = append(h.logs, level+":"+msg) }

func init() {
	Module("pdktest", "0.1.0")
	Event[placed]("OrderPlaced", "order")
	h := Projector("by_client", "order").SequentialBy("client_id")
	On(h, "OrderPlaced", func(ctx *Context, ev placed) error {
		switch ev.OrderID {
		case "reject":
			return Rejected("order %s refused", ev.OrderID)
		case "boom":
			panic("kaboom")
		case "plain":
			return errors.New("plain failure")
		}
		var c counter
		v, err := ctx.Load(Projection, "by_client", ev.ClientID, &c)
		if err != nil {
			return err
		}
		c.N++
		c.IDs = append(c.IDs, ev.OrderID)
		ctx.Log("info", "counted "+ev.OrderID)
		return ctx.Save(Projection, "by_client", ev.ClientID, v, c)
	})
}

func request(ids ...string) []byte {
	req := abi.HandleRequest{Handler: "by_client"}
	for _, id := range ids {
		data, _ := json.Marshal(placed{OrderID: id, ClientID: "c-1"})
		req.Messages = append(req.Messages, abi.Envelope{ID: "m-" + id, Type: "OrderPlaced", Data: data})
	}
	b, _ := json.Marshal(req)
	return b
}

func decode(t *testing.T, out []byte, n int) *abi.HandleResponse {
	t.Helper()
	r, err := abi.DecodeHandleResponse(out, n, abi.DefaultMaxOutputBytes)
	require.NoError(t, err)
	return r
}

func TestManifestFromDeclarations(t *testing.T) {
	m, err := Manifest()
	require.NoError(t, err)
	b, err := json.Marshal(m)
	require.NoError(t, err)
	m2, err := abi.DecodeManifest(b)
	require.NoError(t, err, "the kit's manifest must pass the host's decoder")
	placedMsg, ok := m2.Message("OrderPlaced")
	require.True(t, ok)
	require.Equal(t, []abi.Field{
		{Name: "order_id", Type: abi.FieldString, Required: true},
		{Name: "client_id", Type: abi.FieldString},
		{Name: "total", Type: abi.FieldFloat, Required: true},
		{Name: "Tags", Type: abi.FieldArray, Required: true},
		{Name: "note", Type: abi.FieldString, Required: true},
	}, placedMsg.Fields)
	var h abi.Handler
	for _, h = range m2.Handlers {
		if h.Name == "by_client" {
			break
		}
	}
	require.Equal(t, abi.SequentialBy{Field: "client_id"}, h.SequentialBy)
	require.Equal(t, []string{"OrderPlaced"}, h.Handles)
}

func TestBatchSeesItsOwnWrites(t *testing.T) {
	h := &fakeHost{records: map[string]abi.LoadResponse{
		"projection/by_client/c-1": {Found: true, Version: 7, Data: json.RawMessage(`{"n": 2, "ids": ["a", "b"]}`)},
	}}
	out, err := handle(request("o-1", "o-2", "o-3"), jsonHost{h})
	require.NoError(t, err)
	r := decode(t, out, 3)
	require.Len(t, r.Results, 3)
	for i, res := range r.Results {
		require.Nil(t, res.Error)
		w := res.Effects.Writes[0]
		require.Equal(t, int64(7+i), w.ExpectedVersion, "message %d must see the batch's earlier writes", i)
	}
	var last counter
	require.NoError(t, json.Unmarshal(r.Results[2].Effects.Writes[0].Data, &last))
	require.Equal(t, counter{N: 5, IDs: []string{"a", "b", "o-1", "o-2", "o-3"}}, last)
	require.Equal(t, 1, h.loads, "later messages read the overlay, not the host")
	require.Equal(t, []string{"info:counted o-1", "info:counted o-2", "info:counted o-3"}, h.logs)
}

func TestBatchStopsAtFirstError(t *testing.T) {
	for _, tc := range []struct {
		id   string
		kind abi.ErrorKind
		msg  string
	}{
		{"reject", abi.ErrorRejected, "order reject refused"},
		{"boom", abi.ErrorPermanent, "panicked on OrderPlaced: kaboom"},
		{"plain", abi.ErrorPermanent, "plain failure"},
	} {
		t.Run(tc.id, func(t *testing.T) {
			out, err := handle(request("o-1", tc.id, "o-3"), jsonHost{&fakeHost{}})
			require.NoError(t, err)
			r := decode(t, out, 3)
			require.Len(t, r.Results, 2, "nothing after the failing message is handled")
			require.NotNil(t, r.Results[0].Effects)
			require.Equal(t, tc.kind, r.Results[1].Error.Kind)
			require.Contains(t, r.Results[1].Error.Message, tc.msg)
		})
	}
}

func TestHandleRejectsBadRequests(t *testing.T) {
	_, err := handle([]byte(`{`), jsonHost{&fakeHost{}})
	require.ErrorContains(t, err, "decode handle request")
	_, err = handle([]byte(`{"handler": "nope", "messages": []}`), jsonHost{&fakeHost{}})
	require.ErrorContains(t, err, `module pdktest has no handler "nope"`)

	// A message the handler does not route, and a payload that does not
	// decode, fail that message permanently.
	out, err := handle([]byte(`{"handler": "by_client", "messages": [{"id": "1", "type": "Other", "data": {}}]}`), jsonHost{&fakeHost{}})
	require.NoError(t, err)
	require.Contains(t, decode(t, out, 1).Results[0].Error.Message, "does not handle Other")
	out, err = handle([]byte(`{"handler": "by_client", "messages": [{"id": "1", "type": "OrderPlaced", "data": {"total": "x"}}]}`), jsonHost{&fakeHost{}})
	require.NoError(t, err)
	require.Contains(t, decode(t, out, 1).Results[0].Error.Message, "decode OrderPlaced")
}

// answerHost answers every host-function call with one fixed response.
type answerHost struct{ resp string }

func (h answerHost) load([]byte) []byte       { return []byte(h.resp) }
func (h answerHost) readStream([]byte) []byte { return []byte(h.resp) }
func (h answerHost) log(string, string)       {}

func TestHostErrorsKeepTheirKind(t *testing.T) {
	tests := []struct {
		resp string
		kind abi.ErrorKind
		host abi.HostErrorKind
	}{
		// Out of scope: asking again gets the same answer, so the message
		// fails permanently and is not retried.
		{`{"found":false,"version":0,"messages":null,"error":"outside","error_kind":"scope"}`, abi.ErrorPermanent, abi.HostScope},
		{`{"found":false,"version":0,"messages":null,"error":"bad","error_kind":"invalid"}`, abi.ErrorPermanent, abi.HostInvalid},
		{`{"found":false,"version":0,"messages":null,"error":"gone","error_kind":"not_found"}`, abi.ErrorPermanent, abi.HostNotFound},
		{`{"found":false,"version":0,"messages":null,"error":"raced","error_kind":"conflict"}`, abi.ErrorTransient, abi.HostConflict},
		{`{"found":false,"version":0,"messages":null,"error":"db down","error_kind":"transient"}`, abi.ErrorTransient, abi.HostTransient},
		// An older host sends no kind: transient, as before kinds existed.
		{`{"found":false,"version":0,"messages":null,"error":"db down"}`, abi.ErrorTransient, ""},
	}
	for _, tc := range tests {
		ctx := &Context{host: jsonHost{answerHost{tc.resp}}, batch: &overlay{}}
		var v map[string]any
		_, loadErr := ctx.Load(Aggregate, "order", "o-1", &v)
		_, readErr := ctx.ReadStream("order-o-1", 0, 10)
		for fn, err := range map[string]error{abi.HostLoad: loadErr, abi.HostReadStream: readErr} {
			require.Error(t, err, "%s %s", fn, tc.resp)
			require.Equal(t, tc.kind, toABIError(err).Kind, "%s %s", fn, tc.resp)
			var he *HostError
			require.ErrorAs(t, err, &he)
			require.Equal(t, fn, he.Function)
			require.Equal(t, tc.host, he.Kind)
		}
	}
}
