package redisstream_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/redisstream"
)

func fieldMap(t testing.TB, flat []any) map[string]any {
	t.Helper()
	m := make(map[string]any)
	for i := 0; i < len(flat); i += 2 {
		m[flat[i].(string)] = flat[i+1]
	}
	return m
}

func TestCodecRoundTrip(t *testing.T) {
	t.Parallel()
	for name, in := range map[string]delivery.Message{
		"full": {
			ID: "e-1", Type: "OrderPlaced", Data: json.RawMessage(`{"a":1}`), Metadata: json.RawMessage(`{"b":"x"}`),
			EventStream: "order-o-1", Category: "order", Position: 3, GlobalPosition: -1 << 62,
			Time: time.Date(2026, 2, 3, 4, 5, 6, 7, time.UTC), PartitionKey: "c-1", Prev: 41,
		},
		"only id":     {ID: "e-2"},
		"json null":   {ID: "e-3", Data: json.RawMessage(`null`)},
		"empty event": {ID: "e-4", Data: json.RawMessage(`{}`), Metadata: json.RawMessage(`[]`)},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := redisstream.Decode("1-0", fieldMap(t, redisstream.Encode(in)))
			require.NoError(t, err)
			require.True(t, in.Time.Equal(got.Time))
			got.Time = in.Time
			require.Equal(t, in, got)
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		values map[string]any
		field  string
	}{
		"no id":          {map[string]any{"type": "X"}, "id"},
		"empty id":       {map[string]any{"id": ""}, "id"},
		"id not string":  {map[string]any{"id": 7}, "id"},
		"bad data":       {map[string]any{"id": "a", "data": "{"}, "data"},
		"bad metadata":   {map[string]any{"id": "a", "metadata": "nope"}, "metadata"},
		"bad position":   {map[string]any{"id": "a", "position": "3.5"}, "position"},
		"bad global":     {map[string]any{"id": "a", "global_position": "x"}, "global_position"},
		"bad prev":       {map[string]any{"id": "a", "prev": "x"}, "prev"},
		"bad time":       {map[string]any{"id": "a", "time": "yesterday"}, "time"},
		"type not str":   {map[string]any{"id": "a", "type": []int{1}}, "type"},
		"bytes are fine": {map[string]any{"id": []byte("a"), "data": []byte(`1`)}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := redisstream.Decode("5-1", tc.values)
			if tc.field == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, redisstream.ErrMalformed)
			var de *redisstream.DecodeError
			require.ErrorAs(t, err, &de)
			require.Equal(t, "5-1", de.Entry)
			require.Equal(t, tc.field, de.Field)
			require.Contains(t, err.Error(), "entry 5-1")
		})
	}
}

// FuzzDecode feeds the decoder arbitrary field values: it must never panic,
// fail only with a *DecodeError, and what it accepts must encode and
// decode back to itself.
func FuzzDecode(f *testing.F) {
	f.Add("e-1", "T", `{"a":1}`, `{}`, "order-o-1", "order", "3", "42", "2026-02-03T04:05:06.000000007Z", "c-1")
	f.Add("", "", "", "", "", "", "", "", "", "")
	f.Add("x", "", "{", "null", "", "", "-9223372036854775808", "9223372036854775808", "2026-13-01T00:00:00Z", "")
	f.Fuzz(func(t *testing.T, id, typ, data, md, es, cat, pos, gpos, tm, pk string) {
		values := map[string]any{"id": id}
		for k, v := range map[string]string{"type": typ, "data": data, "metadata": md, "event_stream": es,
			"category": cat, "position": pos, "global_position": gpos, "time": tm, "partition_key": pk} {
			if v != "" {
				values[k] = v
			}
		}
		m, err := redisstream.Decode("1-1", values)
		if err != nil {
			var de *redisstream.DecodeError
			if !errors.As(err, &de) || !errors.Is(err, redisstream.ErrMalformed) {
				t.Fatalf("untyped error %T: %v", err, err)
			}
			return
		}
		again, err := redisstream.Decode("1-1", fieldMap(t, redisstream.Encode(m)))
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if !again.Time.Equal(m.Time) {
			t.Fatalf("time %s became %s", m.Time, again.Time)
		}
		again.Time = m.Time
		if fmt.Sprint(again) != fmt.Sprint(m) {
			t.Fatalf("round trip changed %+v into %+v", m, again)
		}
	})
}
