package partition_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/partition"
)

func TestKeyReason(t *testing.T) {
	t.Parallel()
	const def = partition.DefaultBackfillSuffix
	tests := []struct {
		name   string
		key    string
		suffix string
		want   string
	}{
		{"plain", "client-1", def, ""},
		{"digits", "7", def, ""},
		{"empty", "", def, "partition key is null or empty"},
		{"exactly 255", strings.Repeat("a", 255), def, ""},
		{"256", strings.Repeat("a", 256), def, "partition key exceeds 255 characters (got 256)"},
		{"255 multibyte runes", strings.Repeat("é", 255), def, ""}, // 510 bytes
		{"256 multibyte runes", strings.Repeat("日", 256), def, "partition key exceeds 255 characters (got 256)"},
		{"emoji", "client-🚀", def, ""},
		{"invalid utf8 counts per byte", strings.Repeat("\xff", 256), def, "partition key exceeds 255 characters (got 256)"},
		{"colon", "a:b", def, "partition key contains a colon"},
		{"only colon", ":", def, "partition key contains a colon"},
		{"trailing colon", "client-1:", def, "partition key contains a colon"},
		{"dlq", "dlq", def, "partition key 'dlq' is a reserved lane/DLQ token"},
		{"DLQ is case sensitive", "DLQ", def, ""},
		{"backfill with default suffix", "backfill", def, "partition key 'backfill' is a reserved lane/DLQ token"},
		{"backfill with other suffix", "backfill", "mylane", ""},
		{"custom suffix", "mylane", "mylane", "partition key 'mylane' is a reserved lane/DLQ token"},
		{"dlq with other suffix", "dlq", "mylane", "partition key 'dlq' is a reserved lane/DLQ token"},
		{"sentinel", "__a__", def, "partition key '__a__' uses the reserved '__name__' sentinel form"},
		{"sentinel four underscores", "____", def, "partition key '____' uses the reserved '__name__' sentinel form"},
		{"sentinel partitions", "__partitions__", def, "partition key '__partitions__' uses the reserved '__name__' sentinel form"},
		{"leading only", "__x", def, ""},
		{"trailing only", "x__", def, ""},
		{"leadingonly", "__leadingonly", def, ""},
		{"trailingonly", "trailingonly__", def, ""},
		{"three underscores", "___", def, ""},
		{"two underscores", "__", def, ""},
		// Order of rules: the first failing one reports.
		{"length before colon", strings.Repeat("a", 299) + ":", def, "partition key exceeds 255 characters (got 300)"},
		{"colon before sentinel", "__a:b__", def, "partition key contains a colon"},
		{"length before sentinel", "__" + strings.Repeat("a", 300) + "__", def, "partition key exceeds 255 characters (got 304)"},
		{"reserved before sentinel", "__x__", "__x__", "partition key '__x__' is a reserved lane/DLQ token"},
		{"empty suffix does not reserve empty key", "", "", "partition key is null or empty"},
		// Beyond Protean: control characters, after Protean's rules.
		{"newline", "a\nb", def, "partition key contains a control character"},
		{"tab", "\tclient", def, "partition key contains a control character"},
		{"NUL", "c\x00", def, "partition key contains a control character"},
		{"DEL", "c\x7f", def, "partition key contains a control character"},
		{"C1", "c\u0085", def, "partition key contains a control character"},
		{"space is no control", "client 1", def, ""},
		{"format characters are no control", "c\u200d", def, ""},
		{"colon before control", "a:\n", def, "partition key contains a colon"},
		{"sentinel before control", "__\n__", def, "partition key '__\n__' uses the reserved '__name__' sentinel form"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, partition.KeyReason(tt.key, tt.suffix))
		})
	}
}

func TestKeyString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		in     any
		want   string
		wantOK bool
	}{
		{"nil", nil, "", false},
		{"string", "client-1", "client-1", true},
		{"empty string", "", "", true},
		{"json.Number int", json.Number("7"), "7", true},
		{"json.Number keeps literal", json.Number("7.0"), "7.0", true},
		{"json.Number exponent", json.Number("1e3"), "1e3", true},
		{"float64 integral", float64(7), "7", true},
		{"float64 fraction", 1.5, "1.5", true},
		{"float64 negative", -2.25, "-2.25", true},
		{"float64 large", 1e21, "1e+21", true},
		{"float32", float32(0.1), "0.1", true},
		{"bool true", true, "true", true},
		{"bool false", false, "false", true},
		{"int", 42, "42", true},
		{"int64", int64(-9), "-9", true},
		{"uint64", uint64(18446744073709551615), "18446744073709551615", true},
		{"object", map[string]any{"b": 1.0, "a": "<x>"}, `{"a":"<x>","b":1}`, true},
		{"array", []any{"a", 1.0, nil}, `["a",1,null]`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := partition.KeyString(tt.in)
			require.Equal(t, tt.wantOK, ok)
			require.Equal(t, tt.want, got)
		})
	}
}

// TestKeyStringDecoded runs values through encoding/json both ways a caller
// may decode a message body.
func TestKeyStringDecoded(t *testing.T) {
	t.Parallel()
	body := []byte(`{"s":"c-1","i":7,"f":7.0,"b":true,"n":null,"o":{"k":"v"},"a":[1,2]}`)

	var plain map[string]any
	require.NoError(t, json.Unmarshal(body, &plain))

	var num map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&num))

	tests := []struct {
		field             string
		wantPlain, wantUN string
		wantOK            bool
	}{
		{"s", "c-1", "c-1", true},
		{"i", "7", "7", true},
		{"f", "7", "7.0", true}, // UseNumber keeps the literal
		{"b", "true", "true", true},
		{"n", "", "", false},
		{"missing", "", "", false},
		{"o", `{"k":"v"}`, `{"k":"v"}`, true},
		{"a", "[1,2]", "[1,2]", true},
	}
	for _, tt := range tests {
		got, ok := partition.KeyString(plain[tt.field])
		require.Equal(t, tt.wantOK, ok, tt.field)
		require.Equal(t, tt.wantPlain, got, tt.field)
		got, ok = partition.KeyString(num[tt.field])
		require.Equal(t, tt.wantOK, ok, tt.field)
		require.Equal(t, tt.wantUN, got, tt.field)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		raw        any
		suffix     string
		wantKey    string
		wantReason string // "" means valid
		wantErrKey string
	}{
		{"string", "client-1", "backfill", "client-1", "", ""},
		{"number", json.Number("7"), "backfill", "7", "", ""},
		{"float", 7.0, "backfill", "7", "", ""},
		{"nil", nil, "backfill", "", "partition key is null or empty", ""},
		{"empty", "", "backfill", "", "partition key is null or empty", ""},
		{"object has colon", map[string]any{"k": "v"}, "backfill", "", "partition key contains a colon", `{"k":"v"}`},
		{"array is fine", []any{1.0, 2.0}, "backfill", "[1,2]", "", ""},
		{"reserved", "backfill", "backfill", "", "partition key 'backfill' is a reserved lane/DLQ token", "backfill"},
		{"suffix elsewhere", "backfill", "mylane", "backfill", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			key, err := partition.Validate(tt.raw, tt.suffix)
			if tt.wantReason == "" {
				require.NoError(t, err)
				require.Equal(t, tt.wantKey, key)
				return
			}
			require.Error(t, err)
			require.Empty(t, key)
			require.ErrorIs(t, err, partition.ErrInvalidKey)
			var ke *partition.KeyError
			require.ErrorAs(t, err, &ke)
			require.Equal(t, tt.wantReason, ke.Reason)
			require.Equal(t, tt.wantErrKey, ke.Key)
			require.Equal(t, "invalid partition key: "+tt.wantReason, err.Error())
		})
	}
}

func TestKeyErrorWrapped(t *testing.T) {
	t.Parallel()
	_, err := partition.Validate("a:b", partition.DefaultBackfillSuffix)
	wrapped := fmt.Errorf("module orders.wasm: category order: %w", err)
	require.ErrorIs(t, wrapped, partition.ErrInvalidKey)
	require.False(t, errors.Is(errors.New("other"), partition.ErrInvalidKey))
}

func TestStreamNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, "test::order:client-1", partition.StreamName("test::order", "client-1"))
	require.Equal(t, "test::order:client-1:backfill",
		partition.LaneStreamName("test::order", "client-1", partition.DefaultBackfillSuffix))
	require.Equal(t, "order:7:dlq", partition.LaneStreamName("order", "7", partition.DLQToken))

	// A valid key can never produce the index name or another key's lane:
	// that is what the colon and sentinel rules buy.
	for _, key := range []string{"__partitions__", "x:backfill"} {
		require.NotEmpty(t, partition.KeyReason(key, partition.DefaultBackfillSuffix), key)
	}
}

func FuzzKeyReason(f *testing.F) {
	for _, seed := range []struct{ key, suffix string }{
		{"", "backfill"}, {"client-1", "backfill"}, {"dlq", "backfill"}, {"backfill", "backfill"},
		{"backfill", "mylane"}, {"__a__", "backfill"}, {"___", "backfill"}, {"a:b", "backfill"},
		{strings.Repeat("a", 255), "backfill"}, {strings.Repeat("é", 256), "backfill"},
		{"\xff\xfe", ""}, {"__", "__"}, {"a\nb", "backfill"},
	} {
		f.Add(seed.key, seed.suffix)
	}
	f.Fuzz(func(t *testing.T, key, suffix string) {
		reason := partition.KeyReason(key, suffix)
		if reason != "" {
			_, err := partition.Validate(key, suffix)
			var ke *partition.KeyError
			if !errors.As(err, &ke) || ke.Reason != reason {
				t.Fatalf("Validate(%q, %q) = %v, want reason %q", key, suffix, err, reason)
			}
			return
		}
		if key == "" {
			t.Fatal("empty key accepted")
		}
		if n := utf8.RuneCountInString(key); n > partition.MaxKeyLength {
			t.Fatalf("key of %d runes accepted", n)
		}
		if strings.Contains(key, ":") {
			t.Fatalf("key %q with a colon accepted", key)
		}
		if key == partition.DLQToken || key == suffix {
			t.Fatalf("reserved key %q accepted (suffix %q)", key, suffix)
		}
		if len(key) >= 4 && strings.HasPrefix(key, "__") && strings.HasSuffix(key, "__") {
			t.Fatalf("sentinel key %q accepted", key)
		}
		for _, r := range key {
			if unicode.IsControl(r) {
				t.Fatalf("key %q with a control character accepted", key)
			}
		}
		if got, err := partition.Validate(key, suffix); err != nil || got != key {
			t.Fatalf("Validate(%q, %q) = %q, %v; KeyReason accepted it", key, suffix, got, err)
		}
	})
}

func Example() {
	body := []byte(`{"order_id": "o-1", "client_id": 7}`)
	var msg map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&msg); err != nil {
		panic(err)
	}

	key, err := partition.Validate(msg["client_id"], partition.DefaultBackfillSuffix)
	fmt.Println(partition.StreamName("order", key), err)
	fmt.Println(partition.LaneStreamName("order", key, partition.DefaultBackfillSuffix))
	fmt.Println(partition.DLQStreamName("order", key))

	_, err = partition.Validate(msg["region"], partition.DefaultBackfillSuffix)
	fmt.Println(err)
	fmt.Println(partition.KeyReason("__lease__", partition.DefaultBackfillSuffix))
	// Output:
	// order:7 <nil>
	// order:7:backfill
	// order:7:dlq
	// invalid partition key: partition key is null or empty
	// partition key '__lease__' uses the reserved '__name__' sentinel form
}
