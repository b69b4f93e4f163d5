package pdktest

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/proteanhq/protean-host/pdk"
)

// Codec checks a type's own JSON codec (pdk.JSONDecoder on *T,
// pdk.JSONAppender on T) against encoding/json, which the kit uses for
// every type without one, on each of values: what AppendJSON writes is
// valid JSON that encoding/json reads back as the value, and DecodeJSON
// reads what encoding/json writes as the value, also among fields it does
// not know, and reads a null for each of its fields over the value as
// encoding/json does (a slice, map or pointer becomes nil, anything else
// keeps its value). Key matching is not checked: encoding/json also
// accepts a key that differs in case, which a codec need not. It fails the test when T has neither method,
// so that a codec dropped by a refactoring (a pointer receiver on
// AppendJSON, say) does not leave the check passing on nothing.
//
//	func TestCodec(t *testing.T) {
//		pdktest.Codec(t, PlaceOrder{}, PlaceOrder{OrderID: "o-\"1\"", Total: -1.5e300})
//	}
func Codec[T any](tb testing.TB, values ...T) {
	tb.Helper()
	var zero T
	_, appends := any(zero).(pdk.JSONAppender)
	_, decodes := any(&zero).(pdk.JSONDecoder)
	if !appends && !decodes {
		tb.Fatalf("pdktest.Codec: %T implements neither pdk.JSONAppender nor (as a pointer) pdk.JSONDecoder", zero)
	}
	for _, v := range values {
		if appends {
			b, err := any(v).(pdk.JSONAppender).AppendJSON(nil)
			if err != nil {
				tb.Errorf("%T.AppendJSON(%+v): %v", v, v, err)
				continue
			}
			if !json.Valid(b) {
				tb.Errorf("%T.AppendJSON(%+v) wrote invalid JSON: %s", v, v, b)
				continue
			}
			var back T
			if err := json.Unmarshal(b, &back); err != nil {
				tb.Errorf("%T.AppendJSON(%+v) = %s, which encoding/json cannot read: %v", v, v, b, err)
			} else if !reflect.DeepEqual(back, v) {
				tb.Errorf("%T.AppendJSON(%+v) = %s, which encoding/json reads as %+v", v, v, b, back)
			}
		}
		if decodes {
			std, err := json.Marshal(v)
			if err != nil {
				tb.Fatalf("encoding/json cannot encode %+v: %v", v, err)
			}
			var got T
			if err := any(&got).(pdk.JSONDecoder).DecodeJSON(std); err != nil {
				tb.Errorf("%T.DecodeJSON(%s): %v", v, std, err)
			} else if !reflect.DeepEqual(got, v) {
				tb.Errorf("%T.DecodeJSON(%s) = %+v, want %+v", v, std, got, v)
			}
			decodeTolerant(tb, v, std)
		}
	}
}

// decodeTolerant decodes std (encoding/json's encoding of v) with an
// unknown field of each JSON kind added, which must read as v, then with
// every field null over v, which must read as encoding/json reads it.
func decodeTolerant[T any](tb testing.TB, v T, std []byte) {
	tb.Helper()
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(std, &fields); err != nil {
		return // not an object: nothing to add fields to
	}
	extra := `{"zz_unknown_1":{"a":[1,"x",null,{"b":true}]},"zz_unknown_2":[],"zz_unknown_3":"\"}","zz_unknown_4":-1.5e-7,` + string(std[1:])
	var got T
	if err := any(&got).(pdk.JSONDecoder).DecodeJSON([]byte(extra)); err != nil {
		tb.Errorf("%T.DecodeJSON with unknown fields (%s): %v", v, extra, err)
	} else if !reflect.DeepEqual(got, v) {
		tb.Errorf("%T.DecodeJSON with unknown fields (%s) = %+v, want %+v", v, extra, got, v)
	}
	for name := range fields {
		fields[name] = json.RawMessage("null")
	}
	nulls, err := json.Marshal(fields)
	if err != nil {
		tb.Fatal(err)
	}
	want, got := v, v
	if err := json.Unmarshal(nulls, &want); err != nil {
		tb.Fatal(err)
	}
	if err := any(&got).(pdk.JSONDecoder).DecodeJSON(nulls); err != nil {
		tb.Errorf("%T.DecodeJSON(%s): %v", v, nulls, err)
	} else if !reflect.DeepEqual(got, want) {
		tb.Errorf("%T.DecodeJSON(%s) over %+v = %+v; encoding/json reads %+v", v, nulls, v, got, want)
	}
}
