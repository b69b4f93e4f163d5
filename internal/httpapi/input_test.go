package httpapi_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/httpapi"
	"github.com/proteanhq/protean-host/internal/idempotency"
	"github.com/proteanhq/protean-host/internal/testwait"
)

// Each rule on a request's text: the answer's code, what its error names,
// and whether the command reached the engine.
func TestInputRules(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("9", httpapi.MaxNumberDigits)
	for _, tc := range []struct {
		name    string
		path    string
		headers map[string]string
		body    string
		code    int
		says    string
		fields  []string
	}{
		{name: "plain", body: `{"a":"b"}`, code: 200},
		{name: "correlation id at the cap", headers: map[string]string{"X-Correlation-ID": strings.Repeat("c", 255)}, body: `{}`, code: 200},
		{name: "correlation id over the cap", headers: map[string]string{"X-Correlation-ID": strings.Repeat("c", 256)}, body: `{}`,
			code: 400, says: "X-Correlation-ID is longer than 255 bytes (got 256)"},
		{name: "correlation id not ASCII", headers: map[string]string{"X-Correlation-ID": "caf\xc3\xa9"}, body: `{}`,
			code: 400, says: "X-Correlation-ID must be printable ASCII: byte 3 is 0xc3"},
		{name: "correlation id with a tab", headers: map[string]string{"X-Correlation-ID": "a\tb"}, body: `{}`,
			code: 400, says: "X-Correlation-ID must be printable ASCII: byte 1 is 0x09"},
		{name: "idempotency key over the cap", headers: map[string]string{"Idempotency-Key": strings.Repeat("k", 256)}, body: `{}`,
			code: 400, says: "Idempotency-Key is longer than 255 bytes"},
		{name: "idempotency key not ASCII", headers: map[string]string{"Idempotency-Key": "k\x80"}, body: `{}`,
			code: 400, says: "Idempotency-Key must be printable ASCII: byte 1 is 0x80"},
		{name: "body not UTF-8", body: "{\"id\":\"a\xffb\"}", code: 400, says: "request body is not valid UTF-8 at byte offset 8"},
		{name: "body with a cut rune", body: "{\"id\":\"\xe2\x82\"}", code: 400, says: "at byte offset 7"},
		{name: "NUL in a field", body: `{"a":"b","id":"x\u0000"}`, code: 422, says: `id: holds \u0000`, fields: []string{"id"}},
		{name: "NUL deep inside", body: `{"order":{"lines":[{"sku":"a"},{"sku":"\u0000"}]}}`, code: 422, fields: []string{"order.lines[1].sku"}},
		{name: "NUL in a field name", body: `{"a\u0000":1}`, code: 422, says: "its name holds", fields: []string{`a\u0000`}},
		{name: "escaped backslash then u0000 is text", body: `{"id":"\\u0000"}`, code: 200},
		{name: "lone surrogate", body: `{"id":"\ud800"}`, code: 422, says: "lone surrogate", fields: []string{"id"}},
		{name: "surrogate pair", body: `{"id":"\ud83d\ude00"}`, code: 200},
		{name: "float over the cap", body: `{"n":-` + long + `.0e10}`, code: 422, fields: []string{"n"}},
		{name: "integer at the cap", body: `{"n":` + long + `}`, code: 200},
		{name: "integer over the cap", body: `{"n":` + long + `9}`, code: 422, says: "n: a number of 65 digits: at most 64", fields: []string{"n"}},
		{name: "float of a megabyte", body: `{"f":0.` + strings.Repeat("1", 1<<20-16) + `}`, code: 422, fields: []string{"f"}},
		{name: "problems listed up to the bound", body: `{"a":"\u0000","b":"\u0000","c":"\u0000","d":"\u0000","e":"\u0000"}`,
			code: 422, says: "and 1 more", fields: []string{"a", "b", "c", "d"}},
		{name: "projection path not UTF-8", path: "/v1/projections/docs/%ff", code: 400, says: "path is not valid UTF-8 at byte 21"},
		{name: "command path not UTF-8", path: "/v1/commands/X%c3", body: `{}`, code: 400, says: "path is not valid UTF-8"},
		{name: "path with NUL", path: "/v1/projections/docs/a%00", code: 400, says: "path holds U+0000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := &fakeEngine{}
			srv := httptest.NewServer(httpapi.New(f, httpapi.Options{Idempotency: idempotency.NewMemory(time.Hour, nil)}))
			t.Cleanup(srv.Close)
			method, path := http.MethodPost, "/v1/commands/PlaceOrder"
			if tc.path != "" {
				path = tc.path
				if strings.HasPrefix(path, "/v1/projections/") {
					method = http.MethodGet
				}
			}
			req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(tc.body))
			require.NoError(t, err)
			for k, v := range tc.headers {
				req.Header[k] = []string{v}
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			var out struct {
				Error  string   `json:"error"`
				Fields []string `json:"fields"`
			}
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
			require.Equal(t, tc.code, resp.StatusCode, out.Error)
			require.Contains(t, out.Error, tc.says)
			require.Equal(t, tc.fields, out.Fields)
			if tc.code != 200 {
				require.Nil(t, f.got, "a refused request never reaches the engine")
			}
		})
	}
}

// rawConn sends what the test writes as it is and reads the answer.
func rawConn(t *testing.T, url string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(testwait.Limit())))
	return c, bufio.NewReader(c)
}

// A Content-Length over the bound answers 413 at once: no 100 Continue,
// no body read.
func TestTooLargeBodyAnswersBeforeContinue(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(httpapi.New(&fakeEngine{}, httpapi.Options{}))
	t.Cleanup(srv.Close)
	c, r := rawConn(t, srv.URL)
	_, err := fmt.Fprintf(c, "POST /v1/commands/X HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n", httpapi.MaxBodyBytes+1)
	require.NoError(t, err)
	resp, err := http.ReadResponse(r, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
}

// A chunked body over the bound answers 413, read by the client, not a
// reset.
func TestTooLargeChunkedBody(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(httpapi.New(&fakeEngine{}, httpapi.Options{}))
	t.Cleanup(srv.Close)
	c, r := rawConn(t, srv.URL)
	_, err := io.WriteString(c, "POST /v1/commands/X HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
	require.NoError(t, err)
	chunk := strings.Repeat("x", 64<<10)
	for range 3 * httpapi.MaxBodyBytes / len(chunk) {
		_, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(chunk), chunk)
		require.NoError(t, err)
	}
	_, err = io.WriteString(c, "0\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(r, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, string(b), "request body exceeds 1048576 bytes")
}

// A body that stops coming is cut at the body timeout with 408.
func TestSlowBodyIsCut(t *testing.T) {
	t.Parallel()
	f := &fakeEngine{}
	srv := httptest.NewServer(httpapi.New(f, httpapi.Options{BodyTimeout: 50 * time.Millisecond}))
	t.Cleanup(srv.Close)
	c, r := rawConn(t, srv.URL)
	_, err := io.WriteString(c, "POST /v1/commands/X HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{\"a\"")
	require.NoError(t, err)
	resp, err := http.ReadResponse(r, nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	require.Nil(t, f.got)
}
