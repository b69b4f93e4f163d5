package abi_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
)

var placeOrder = abi.Message{Type: "PlaceOrder", Kind: abi.MessageCommand, Category: "order", Fields: []abi.Field{
	{Name: "order_id", Type: abi.FieldString, Required: true},
	{Name: "qty", Type: abi.FieldInt, Required: true},
	{Name: "total", Type: abi.FieldFloat},
	{Name: "rush", Type: abi.FieldBool},
	{Name: "lines", Type: abi.FieldArray},
	{Name: "address", Type: abi.FieldObject},
	{Name: "extra", Type: abi.FieldAny},
	{Name: "note"},
}}

func TestCheckPayload(t *testing.T) {
	for _, tc := range []struct {
		name, data string
		want       string // "" for accepted
		fields     []string
	}{
		{"minimal", `{"order_id":"o","qty":1}`, "", nil},
		{"every type", `{"order_id":"o","qty":-9223372036854775808,"total":1.5e3,"rush":false,"lines":[],"address":{},"extra":[1],"note":"x"}`, "", nil},
		{"null optional", `{"order_id":"o","qty":1,"total":null,"extra":null}`, "", nil},
		{"whitespace", " { \"order_id\" : \"o\" , \"qty\" : 2 } ", "", nil},
		{"string for int", `{"order_id":"o","qty":"1"}`, `qty: want an integer, got string "1"`, []string{"qty"}},
		{"fraction for int", `{"order_id":"o","qty":1.5}`, "qty: want an integer, got number 1.5", []string{"qty"}},
		{"exponent for int", `{"order_id":"o","qty":1e3}`, "qty: want an integer, got number 1e3", []string{"qty"}},
		{"int out of range", `{"order_id":"o","qty":9223372036854775808}`, "qty: integer 9223372036854775808 is out of range (int64)", []string{"qty"}},
		{"float out of range", `{"order_id":"o","qty":1,"total":-1e400}`, "total: number -1e400 is out of range (float64)", []string{"total"}},
		{"bool", `{"order_id":"o","qty":1,"rush":"yes"}`, `rush: want true or false, got string "yes"`, []string{"rush"}},
		{"array", `{"order_id":"o","qty":1,"lines":{}}`, "lines: want an array, got object {}", []string{"lines"}},
		{"object", `{"order_id":"o","qty":1,"address":[]}`, "address: want an object, got array []", []string{"address"}},
		{"missing", `{"qty":1}`, "order_id: missing (required)", []string{"order_id"}},
		{"null required", `{"order_id":null,"qty":1}`, "order_id: must not be null (required)", []string{"order_id"}},
		{"unknown", `{"order_id":"o","qty":1,"b":1,"a":2}`, "a: unknown field; b: unknown field", []string{"a", "b"}},
		{"duplicate", `{"order_id":"o","qty":1,"qty":2}`, "qty: appears more than once", []string{"qty"}},
		{"long value clipped", `{"order_id":"` + strings.Repeat("é", 100) + `","qty":"` + strings.Repeat("y", 1000) + `"}`,
			`qty: want an integer, got string "` + strings.Repeat("y", 63) + "…", []string{"qty"}},
		{"many problems", `{"a":1,"b":2,"c":3,"d":4,"e":5}`, "; and 3 more", []string{"order_id", "qty", "a", "b"}},
		{"not an object", `[1]`, ": the payload must be a JSON object", []string{""}},
		{"trailing", `{"order_id":"o","qty":1} {}`, "trailing data", []string{""}},
		{"broken", `{"order_id":"o",`, "not valid JSON", []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := placeOrder.CheckPayload([]byte(tc.data))
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, abi.ErrInput)
			var ie *abi.InputError
			require.True(t, errors.As(err, &ie))
			require.Contains(t, err.Error(), tc.want)
			require.True(t, strings.HasPrefix(err.Error(), "PlaceOrder: "), err.Error())
			require.Equal(t, tc.fields, ie.Fields())
			require.Less(t, len(err.Error()), 600)
		})
	}
}

func TestClip(t *testing.T) {
	require.Equal(t, "abc", abi.Clip("abc", 3))
	require.Equal(t, "ab…", abi.Clip("abcd", 2))
	require.Equal(t, "…", abi.Clip("éé", 1), "never cuts inside a rune")
}

func FuzzCheckPayload(f *testing.F) {
	f.Add([]byte(`{"order_id":"o","qty":1}`))
	f.Add([]byte(`{"qty":1e400,"x":null}`))
	f.Add([]byte(` {"a":[{"b":1}]} `))
	f.Fuzz(func(t *testing.T, b []byte) {
		err := placeOrder.CheckPayload(b)
		var ie *abi.InputError
		if err != nil && (!errors.As(err, &ie) || len(ie.Problems) == 0 || len(ie.Problems) > abi.MaxInputProblems) {
			t.Fatalf("error %v is not an InputError with 1..%d problems", err, abi.MaxInputProblems)
		}
	})
}
