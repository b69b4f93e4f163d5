package pdk

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
)

type rename struct {
	OrderID string `json:"order_id"`
	Name    string `json:"name"`
	Count   int8   `json:"count"`
}

func init() {
	Command[rename]("Rename", "order")
	h := CommandHandler("renamer", "order")
	On(h, "Rename", func(*Context, rename) error { return nil })
}

// A command payload the handler's Go type cannot hold is the client's
// mistake: rejected (the host answers 422) and naming the field. An event
// the handler cannot read stays a permanent failure.
func TestDecodeFailureKinds(t *testing.T) {
	call := func(handler, typ, data string) *abi.Error {
		req, _ := json.Marshal(abi.HandleRequest{Handler: handler, Messages: []abi.Envelope{{ID: "m-1", Type: typ, Data: json.RawMessage(data)}}})
		out, err := handle(req, jsonHost{&fakeHost{}})
		require.NoError(t, err)
		r := decode(t, out, 1)
		require.NotNil(t, r.Results[0].Error)
		return r.Results[0].Error
	}
	e := call("renamer", "Rename", `{"order_id":"o-1","name":"n","count":300}`)
	require.Equal(t, abi.ErrorRejected, e.Kind)
	require.Contains(t, e.Message, "decode Rename: count: want int8, got JSON number 300")

	e = call("by_client", "OrderPlaced", `{"order_id":5}`)
	require.Equal(t, abi.ErrorPermanent, e.Kind)
	require.Contains(t, e.Message, "decode OrderPlaced: order_id")
}

type optionality struct {
	Plain    string         `json:"plain"`
	Pointer  *string        `json:"pointer"`
	Omit     int            `json:"omit,omitempty"`
	Zero     float64        `json:"zero,string,omitzero"`
	Iface    any            `json:"iface"`
	Untagged bool           //nolint:tagliatelle // the Go name is the JSON name
	Map      map[string]int `json:"map"`
	*optionalEmbedded
}

type optionalEmbedded struct {
	Inner string `json:"inner"`
}

func TestFieldsOfRequired(t *testing.T) {
	require.Equal(t, []abi.Field{
		{Name: "plain", Type: abi.FieldString, Required: true},
		{Name: "pointer", Type: abi.FieldString},
		{Name: "omit", Type: abi.FieldInt},
		{Name: "zero", Type: abi.FieldFloat},
		{Name: "iface", Type: abi.FieldAny},
		{Name: "Untagged", Type: abi.FieldBool, Required: true},
		{Name: "map", Type: abi.FieldObject, Required: true},
		{Name: "inner", Type: abi.FieldString},
	}, FieldsOf(reflect.TypeFor[optionality]()))
}
