package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/auth"
	"github.com/proteanhq/protean-host/internal/deploy"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/httpapi"
)

// fakeReload stands for the reloader: a directory holding a file that
// starts with "bad" is rejected, naming it; one that starts with "slow"
// is reloaded once ctx ends (canceled).
func fakeReload(dir string) func(ctx context.Context) (host.Outcome, []error) {
	return func(ctx context.Context) (host.Outcome, []error) {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return host.Rejected, []error{err}
		}
		var problems []error
		for _, e := range entries {
			if !strings.HasSuffix(e.Name(), ".wasm") {
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				return host.Rejected, []error{err}
			}
			if strings.HasPrefix(string(b), "bad") {
				problems = append(problems, &host.LoadError{File: e.Name(), Err: host.ErrNotWASM})
			}
		}
		if len(problems) > 0 {
			return host.Rejected, problems
		}
		return host.Applied, nil
	}
}

type modulesServer struct {
	url   string
	dir   string
	audit *audit.Memory
}

func newModulesServer(t *testing.T, opts httpapi.Options) modulesServer {
	t.Helper()
	s := modulesServer{dir: t.TempDir(), audit: audit.NewMemory(nil)}
	opts.Modules = deploy.New(deploy.Options{Dir: s.dir, Reload: fakeReload(s.dir), Audit: s.audit, MaxModuleBytes: 16,
		TenantOf: func(m string) string {
			if strings.HasPrefix(m, "lab_") {
				return "lab"
			}
			return "shop"
		}})
	srv := httptest.NewServer(httpapi.New(&fakeEngine{}, opts))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

type modAnswer struct {
	code  int
	allow string
	body  map[string]any
}

func callModules(t *testing.T, method, url, key, body string) modAnswer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	a := modAnswer{code: resp.StatusCode, allow: resp.Header.Get("Allow")}
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"), string(b))
	require.NoError(t, json.Unmarshal(b, &a.body), string(b))
	return a
}

func TestModuleRoutesAnswerEachOutcome(t *testing.T) {
	s := newModulesServer(t, httpapi.Options{})
	m := s.url + "/v1/modules/"

	a := callModules(t, "PUT", m+"orders", "", "good v1")
	require.Equal(t, 200, a.code, a.body)
	require.Equal(t, "orders", a.body["name"])
	require.Equal(t, "shop", a.body["tenant"])
	require.Equal(t, "applied", a.body["outcome"])
	require.Len(t, a.body["sha256"], 64)
	v1 := a.body["sha256"]

	require.Equal(t, 200, callModules(t, "PUT", m+"orders", "", "good v2").code)

	a = callModules(t, "PUT", m+"orders", "", "bad bytes")
	require.Equal(t, 422, a.code, a.body)
	require.Equal(t, "rejected", a.body["outcome"])
	require.Contains(t, a.body["error"], "module orders: reload rejected")
	require.Equal(t, []any{map[string]any{"file": "orders.wasm", "error": "orders.wasm: " + host.ErrNotWASM.Error()}}, a.body["problems"])
	b, err := os.ReadFile(filepath.Join(s.dir, "orders.wasm"))
	require.NoError(t, err)
	require.Equal(t, "good v2", string(b), "the previous bytes are back")

	a = callModules(t, "PUT", m+"orders", "", strings.Repeat("x", 17))
	require.Equal(t, 413, a.code, a.body)
	a = callModules(t, "PUT", m+".orders", "", "good")
	require.Equal(t, 400, a.code, a.body)
	require.Contains(t, a.body["error"], "invalid module name")

	a = callModules(t, "GET", s.url+"/v1/modules", "", "")
	require.Equal(t, 200, a.code, a.body)
	mods := a.body["modules"].([]any)
	require.Len(t, mods, 1)
	orders := mods[0].(map[string]any)
	require.Equal(t, "orders", orders["name"])
	require.Len(t, orders["history"], 1)

	a = callModules(t, "POST", m+"orders/rollback", "", "")
	require.Equal(t, 200, a.code, a.body)
	require.Equal(t, v1, a.body["sha256"])

	a = callModules(t, "DELETE", m+"orders", "", "")
	require.Equal(t, 200, a.code, a.body)
	require.Equal(t, "applied", a.body["outcome"])
	require.NoFileExists(t, filepath.Join(s.dir, "orders.wasm"))
	a = callModules(t, "DELETE", m+"orders", "", "")
	require.Equal(t, 404, a.code, a.body)
	a = callModules(t, "POST", m+"nothing/rollback", "", "")
	require.Equal(t, 409, a.code, a.body)
	require.Contains(t, a.body["error"], "no earlier version")

	entries, err := s.audit.List(context.Background(), audit.Query{})
	require.NoError(t, err)
	require.Len(t, entries, 9, "one entry per action")
	for _, e := range entries {
		require.Equal(t, "anonymous", e.Principal, "without credentials")
	}
}

func TestModuleRoutesKnowTheirMethods(t *testing.T) {
	s := newModulesServer(t, httpapi.Options{})
	for _, tc := range []struct{ method, path, allow string }{
		{"POST", "/v1/modules", "GET"},
		{"GET", "/v1/modules/orders", "PUT, DELETE"},
		{"POST", "/v1/modules/orders", "PUT, DELETE"},
		{"GET", "/v1/modules/orders/rollback", "POST"},
	} {
		a := callModules(t, tc.method, s.url+tc.path, "", "")
		require.Equal(t, 405, a.code, "%s %s", tc.method, tc.path)
		require.Equal(t, tc.allow, a.allow)
	}
	require.Equal(t, 404, callModules(t, "GET", s.url+"/v1/modules/orders/other", "", "").code)
}

func TestModuleRoutesAreOffWithoutModules(t *testing.T) {
	srv := httptest.NewServer(httpapi.New(&fakeEngine{}, httpapi.Options{}))
	defer srv.Close()
	for _, mp := range [][2]string{{"GET", "/v1/modules"}, {"PUT", "/v1/modules/orders"}, {"DELETE", "/v1/modules/orders"},
		{"POST", "/v1/modules/orders/rollback"}, {"PATCH", "/v1/modules"}} {
		a := callModules(t, mp[0], srv.URL+mp[1], "", "x")
		require.Equal(t, 404, a.code, mp)
		require.Contains(t, a.body["error"], "module deploys are not enabled")
	}
}

// A body that does not arrive within the body timeout answers 408 and
// changes nothing.
func TestAModuleBodyNotReadInTimeIs408(t *testing.T) {
	s := newModulesServer(t, httpapi.Options{BodyTimeout: 50 * time.Millisecond})
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() { _, _ = pw.Write([]byte("good")) }() // and then nothing
	req, err := http.NewRequest("PUT", s.url+"/v1/modules/orders", pr)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 408, resp.StatusCode)
	require.NoFileExists(t, filepath.Join(s.dir, "orders.wasm"))
}

// With credentials, the list holds the modules of the tenants the
// principal deploys (all for an admin), and the audit names the key.
func TestModuleListIsTheDeployersTenants(t *testing.T) {
	keys := map[string]string{}
	var conf []auth.Key
	for _, k := range []struct {
		name, tenant string
		role         auth.Role
	}{{"shop", "shop", auth.RoleDeployer}, {"lab", "lab", auth.RoleDeployer}, {"admin", "", auth.RoleAdmin}, {"shop-op", "shop", auth.RoleOperator}} {
		key, hash, err := auth.NewKey()
		require.NoError(t, err)
		keys[k.name] = key
		conf = append(conf, auth.Key{Tenant: k.tenant, Role: k.role, SHA256: hash})
	}
	ks, err := auth.NewKeys(conf)
	require.NoError(t, err)
	s := newModulesServer(t, httpapi.Options{Auth: auth.NewLive(&auth.Authenticator{Keys: ks})})
	require.Equal(t, 200, callModules(t, "PUT", s.url+"/v1/modules/orders", keys["shop"], "good").code)
	require.Equal(t, 403, callModules(t, "PUT", s.url+"/v1/modules/lab_x", keys["shop"], "good").code)
	require.Equal(t, 200, callModules(t, "PUT", s.url+"/v1/modules/lab_x", keys["lab"], "good").code)
	names := func(key string) []string {
		a := callModules(t, "GET", s.url+"/v1/modules", key, "")
		require.Equal(t, 200, a.code, a.body)
		var out []string
		for _, m := range a.body["modules"].([]any) {
			out = append(out, m.(map[string]any)["name"].(string))
		}
		return out
	}
	require.Equal(t, []string{"orders"}, names(keys["shop"]))
	require.Equal(t, []string{"lab_x"}, names(keys["lab"]))
	require.Equal(t, []string{"lab_x", "orders"}, names(keys["admin"]))
	require.Equal(t, 403, callModules(t, "GET", s.url+"/v1/modules", keys["shop-op"], "").code)

	entries, err := s.audit.List(context.Background(), audit.Query{})
	require.NoError(t, err)
	require.Len(t, entries, 2, "a refused request never reaches the deployer")
	require.Equal(t, "key:"+auth.KeyID(auth.Hash(keys["lab"])), entries[0].Principal)
	require.Equal(t, "lab", entries[0].Tenant)
}

// A plugins directory that is not there: 500, naming it.
func TestModuleRoutesAnswer500OnAFailingDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gone")
	srv := httptest.NewServer(httpapi.New(&fakeEngine{}, httpapi.Options{Modules: deploy.New(deploy.Options{Dir: dir,
		Reload: fakeReload(dir), Audit: audit.NewMemory(nil)})}))
	defer srv.Close()
	a := callModules(t, "GET", srv.URL+"/v1/modules", "", "")
	require.Equal(t, 500, a.code)
	require.Contains(t, a.body["error"], "gone")
	a = callModules(t, "PUT", srv.URL+"/v1/modules/orders", "", "good")
	require.Equal(t, 500, a.code)
	require.Contains(t, a.body["error"], "module orders")
}
