package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/auth"
	"github.com/proteanhq/protean-host/internal/engine"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/httpapi"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/record"
)

// fakeEngine answers every command with err.
type fakeEngine struct {
	err     error
	healthy error
	got     json.RawMessage
}

func (f *fakeEngine) Dispatch(_ context.Context, typ string, data json.RawMessage, _ abi.Metadata) (*engine.CommandResult, error) {
	f.got = data
	if f.err != nil {
		return nil, f.err
	}
	return &engine.CommandResult{ID: "c-1"}, nil
}

func (f *fakeEngine) Projection(_ context.Context, name, id string) (json.RawMessage, int64, error) {
	if name != "docs" {
		return nil, 0, fmt.Errorf("%w: %s", engine.ErrUnknownProjection, name)
	}
	if id != "1" {
		return nil, 0, engine.ErrNotFound
	}
	return json.RawMessage(projectionDoc), 7, nil
}

// projectionDoc is the document the fake engine answers: key order, spacing
// and a number's form that a re-encoding would change.
const projectionDoc = `{"z":1,"a":[1, 2],"n":1.50}`

func (f *fakeEngine) Set() *host.Set { return &host.Set{} }
func (f *fakeEngine) Healthy() error { return f.healthy }

func TestErrorStatuses(t *testing.T) {
	keyErr := &unitofwork.KeyError{Category: "order", Type: "OrderPlaced", Field: "client_id", Err: &partition.KeyError{Key: "a:b", Reason: "partition key contains a colon"}}
	for _, tc := range []struct {
		name string
		err  error
		code int
	}{
		{"ok", nil, 200},
		{"unknown command", fmt.Errorf("%w: X", engine.ErrUnknownCommand), 404},
		{"bad input", engine.ErrBadInput, 400},
		{"record conflict", &record.VersionError{Expected: 1, Actual: 2}, 409},
		{"stream conflict", &eventstore.VersionError{Stream: "order-1", Expected: -1, Actual: 0}, 409},
		{"rejected key", keyErr, 422},
		{"handler rejection", &engine.HandlerError{Kind: abi.ErrorRejected, Err: errors.New("no")}, 422},
		{"handler failure", &engine.HandlerError{Kind: abi.ErrorPermanent, Err: errors.New("bug")}, 500},
		{"transient handler failure", &engine.HandlerError{Kind: abi.ErrorTransient, Err: errors.New("later")}, 500},
		{"stopping", engine.ErrStopped, 503},
		{"module not ready", &engine.HandlerError{Kind: abi.ErrorTransient, Err: fmt.Errorf("compiling: %w", host.ErrNotReady)}, 503},
		{"anything else", errors.New("disk on fire"), 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(httpapi.New(&fakeEngine{err: tc.err}, httpapi.Options{}))
			defer srv.Close()
			resp, err := http.Post(srv.URL+"/v1/commands/PlaceOrder", "application/json", strings.NewReader(`{"a":1}`))
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, tc.code, resp.StatusCode)
			require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			if errors.Is(tc.err, host.ErrNotReady) {
				require.Equal(t, "2", resp.Header.Get("Retry-After"))
			} else {
				require.Empty(t, resp.Header.Get("Retry-After"))
			}
			var body map[string]any
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
			if tc.err != nil {
				require.Equal(t, tc.err.Error(), body["error"])
			}
		})
	}
}

func TestRequestsAndRoutes(t *testing.T) {
	f := &fakeEngine{}
	srv := httptest.NewServer(httpapi.New(f, httpapi.Options{}))
	defer srv.Close()
	do := func(method, path, body string) (int, string, http.Header) {
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = fmt.Fprint(&b, readAll(t, resp))
		return resp.StatusCode, b.String(), resp.Header
	}
	for _, bad := range []string{``, `{`, `[]`, `null`, `"x"`, `{"a":1} trailing`} {
		code, body, _ := do("POST", "/v1/commands/X", bad)
		require.Equal(t, 400, code, "body %q", bad)
		require.Contains(t, body, "request body must be a JSON object")
	}
	code, _, _ := do("POST", "/v1/commands/X", `{"a":`+strings.Repeat(" ", httpapi.MaxBodyBytes)+`1}`)
	require.Equal(t, 413, code)
	code, body, hdr := do("GET", "/v1/projections/docs/1", "")
	require.Equal(t, 200, code)
	require.Equal(t, projectionDoc, body, "a projection document is answered as stored, not re-encoded")
	require.Equal(t, "7", hdr.Get("X-Record-Version"))
	code, _, _ = do("GET", "/v1/projections/docs/2", "")
	require.Equal(t, 404, code)
	code, _, _ = do("GET", "/v1/projections/other/1", "")
	require.Equal(t, 404, code)
	code, body, _ = do("GET", "/nope", "")
	require.Equal(t, 404, code)
	require.Contains(t, body, "no route for GET /nope")
	code, _, _ = do("GET", "/v1/commands/X", "")
	require.Equal(t, 405, code, "a known path with the wrong method")
	code, _, _ = do("GET", "/healthz", "")
	require.Equal(t, 200, code)
	f.healthy = engine.ErrStopped
	code, _, _ = do("GET", "/healthz", "")
	require.Equal(t, 503, code)
	code, body, _ = do("GET", "/metrics", "")
	require.Equal(t, 200, code)
	require.Contains(t, body, `protean_http_requests_total{code="400",route="POST /v1/commands/{type}"} 6`)
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

// TestPprof: /debug/pprof/ is served only when asked for, to an admin,
// and on the admin listener of a split API.
func TestPprof(t *testing.T) {
	get := func(h http.Handler, path, key string) (int, string) {
		req := httptest.NewRequest("GET", path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code, w.Body.String()
	}
	code, _ := get(httpapi.New(&fakeEngine{}, httpapi.Options{}), "/debug/pprof/", "")
	require.Equal(t, 404, code, "off by default")

	on := httpapi.New(&fakeEngine{}, httpapi.Options{Pprof: true})
	code, body := get(on, "/debug/pprof/", "")
	require.Equal(t, 200, code)
	require.Contains(t, body, "goroutine")
	code, body = get(on, "/debug/pprof/goroutine?debug=1", "")
	require.Equal(t, 200, code)
	require.Contains(t, body, "goroutine profile")

	admin, adminHash, err := auth.NewKey()
	require.NoError(t, err)
	reader, readerHash, err := auth.NewKey()
	require.NoError(t, err)
	keys, err := auth.NewKeys([]auth.Key{{Role: auth.RoleAdmin, SHA256: adminHash}, {Tenant: "shop", Role: auth.RoleOperator, SHA256: readerHash}})
	require.NoError(t, err)
	ingress, adm := httpapi.NewSplit(&fakeEngine{}, httpapi.Options{Pprof: true, Auth: auth.NewLive(&auth.Authenticator{Keys: keys})})
	code, _ = get(adm, "/debug/pprof/heap?debug=1", admin)
	require.Equal(t, 200, code)
	code, _ = get(adm, "/debug/pprof/heap?debug=1", reader)
	require.Equal(t, 403, code, "an admin's")
	code, _ = get(adm, "/debug/pprof/heap?debug=1", "")
	require.Equal(t, 401, code)
	code, _ = get(ingress, "/debug/pprof/heap?debug=1", admin)
	require.Equal(t, 404, code, "not on the ingress listener")
}
