package httpapi_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"unicode/utf8"

	"github.com/proteanhq/protean-host/internal/httpapi"
	"github.com/proteanhq/protean-host/internal/jsonnul"
)

// FuzzHandler sends the API any path, correlation header and body, as a
// command and as a projection read. It must never panic nor answer 5xx
// (the engine here always succeeds), every answer but a 200 or the mux's
// redirect to a clean path must be a JSON error, and a body that reaches the engine must be the bytes sent,
// unchanged, which the stores can keep as they are.
func FuzzHandler(f *testing.F) {
	f.Add("PlaceOrder", "c-1", []byte(`{"id":"a"}`))
	f.Add("P%ff", "", []byte("{\"id\":\"\xff\"}"))
	f.Add("X", "caf\xc3\xa9", []byte(`{"a":"\u0000","b":[1,{"c":"\ud800"}]}`))
	f.Add("X", "", []byte(`{"n":1`+string(bytes.Repeat([]byte("0"), 80))+`}`))
	f.Add("%00", "\t", []byte(`{"a\u0000":-1.5e-7}`))
	f.Fuzz(func(t *testing.T, name, correlation string, body []byte) {
		e := &fakeEngine{}
		h := httpapi.New(e, httpapi.Options{})
		for _, path := range []string{"/v1/commands/" + name, "/v1/projections/docs/" + name} {
			u, err := url.Parse("http://x" + path)
			if err != nil {
				u = &url.URL{Path: path}
			}
			method := http.MethodPost
			if path[4] == 'p' {
				method = http.MethodGet
			}
			req := &http.Request{Method: method, URL: u, Header: http.Header{"X-Correlation-Id": {correlation}},
				Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)), Host: "x", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code >= 500 {
				t.Fatalf("%s %q: %d %s", method, path, rec.Code, rec.Body)
			}
			if rec.Code != http.StatusOK && (rec.Code < 300 || rec.Code >= 400) { // 3xx: the mux cleans a path
				var out struct{ Error string }
				if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Error == "" {
					t.Fatalf("%s %q: %d answer is not a JSON error: %q", method, path, rec.Code, rec.Body)
				}
			}
			if e.got != nil {
				if !bytes.Equal(e.got, body) {
					t.Fatalf("the engine got %q, not the body sent %q", e.got, body)
				}
				if why := jsonnul.Refused(e.got); why != "" || !utf8.Valid(e.got) {
					t.Fatalf("the engine got a body the stores refuse (%s): %q", why, e.got)
				}
				e.got = nil
			}
		}
	})
}
