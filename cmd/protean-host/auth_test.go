package main

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/auth"
	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// authFixture is a plugins directory of two tenants, shop (orders and
// its client_orders projection, which it grants lab to read) and lab
// (behave, which grants shop the dispatch of Again), and one API key per
// principal the table uses.
type authFixture struct {
	dir  string
	keys map[string]string // principal -> API key
	conf []config.APIKey
}

func newAuthFixture(t *testing.T) authFixture {
	t.Helper()
	examples := wasmbuild.Examples(t)
	dir := t.TempDir()
	wasmbuild.Copy(t, filepath.Join(examples, "orders.wasm"), dir, "orders.wasm")
	wasmbuild.Copy(t, filepath.Join(examples, "client_orders.wasm"), dir, "client_orders.wasm")
	wasmbuild.Copy(t, wasmbuild.Build(t, "./internal/host/testdata/plugins/behave"), dir, "behave.wasm")
	f := authFixture{dir: dir, keys: map[string]string{}}
	for _, p := range []struct{ name, tenant, role string }{
		{"shop-read", "shop", "read"}, {"shop-write", "shop", "write"}, {"shop-operator", "shop", "operator"},
		{"shop-deployer", "shop", "deployer"}, {"lab-write", "lab", "write"}, {"lab-operator", "lab", "operator"}, {"admin", "", "admin"},
		{"shop-write-old", "shop", "write"}, // a second key of one tenant and role: a rotation's overlap
	} {
		key, hash, err := auth.NewKey()
		require.NoError(t, err)
		f.keys[p.name] = key
		f.conf = append(f.conf, config.APIKey{Tenant: p.tenant, Role: p.role, SHA256: hash})
	}
	return f
}

// apply configures the tenants and the keys.
func (f authFixture) apply(c *config.Config) {
	c.Tenants = map[string]config.Tenant{
		// shop_extra: a module not deployed yet; shop lets lab's readers
		// read its client_orders projection.
		"shop": {Modules: []string{"orders", "client_orders", "shop_extra"}, GrantProjections: map[string][]string{"lab": {"client_orders"}}},
		"lab":  {Modules: []string{"behave"}, GrantDispatch: map[string][]string{"shop": {"Again"}}},
	}
	c.HTTP.Auth.Keys = f.conf
}

// request makes one request as principal (a name of f.keys; "none" sends
// no Authorization, "bad" a key no config knows).
func (f authFixture) request(t *testing.T, h *testHost, principal, method, path, body string) (int, string) {
	t.Helper()
	return f.requestAt(t, h.addr, principal, method, path, body)
}

// requestAt is request to the listener at addr.
func (f authFixture) requestAt(t *testing.T, addr, principal, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	require.NoError(t, err)
	switch principal {
	case "none":
	case "bad":
		req.Header.Set("Authorization", "Bearer "+auth.KeyPrefix+"AAAAnotakeyAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	default:
		req.Header.Set("Authorization", "Bearer "+f.keys[principal])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// requireAccessTable runs every route against every principal: a
// principal allowed a route gets the route's own answer (never 401 or
// 403), any other gets 403, and a request without a valid credential
// 401. A route that names a command or projection that does not exist
// answers as one of another tenant's does, but to an admin.
func requireAccessTable(t *testing.T, h *testHost, f authFixture) {
	all := []string{"shop-read", "shop-write", "shop-write-old", "shop-operator", "shop-deployer", "lab-write", "lab-operator", "admin"}
	operators := []string{"shop-operator", "lab-operator", "admin"}
	routes := []struct {
		method, path, body string
		allowed            []string
	}{
		{"POST", "/v1/commands/PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":1}`, []string{"shop-write", "shop-write-old", "admin"}},
		{"POST", "/v1/commands/Increment", `{"id":"x"}`, []string{"lab-write", "admin"}},
		{"POST", "/v1/commands/Again", `{"id":"y"}`, []string{"lab-write", "shop-write", "shop-write-old", "admin"}}, // lab grants shop its dispatch
		{"POST", "/v1/commands/NoSuchCommand", `{}`, []string{"admin"}},
		{"GET", "/v1/projections/client_orders/c-1", "", []string{"shop-read", "shop-write", "shop-write-old", "lab-write", "admin"}}, // shop grants lab the projection
		{"GET", "/v1/projections/no_such_projection/x", "", []string{"admin"}},
		{"GET", "/v1/plugins", "", []string{"admin"}},
		{"GET", "/", "", operators}, // an operator's page is its tenant's part (TestOperationsAreTheTenants)
		{"GET", "/metrics", "", []string{"admin"}},
		{"GET", "/healthz", "", append([]string{"none", "bad"}, all...)},
		// The operations API: any operator's credential lists (its own
		// tenant's items: TestOperationsAreTheTenants); an action on a
		// target that does not exist is refused as another tenant's is.
		{"GET", "/v1/ops/partitions", "", operators},
		{"GET", "/v1/ops/subscriptions", "", operators},
		{"GET", "/v1/ops/subscriptions/failures?all=true", "", operators},
		{"GET", "/v1/ops/outbox", "", operators},
		{"GET", "/v1/ops/dead-letters", "", operators},
		{"GET", "/v1/ops/audit", "", append([]string{"shop-deployer"}, operators...)}, // a deployer reads its tenant's entries
		{"GET", "/v1/ops/partitions/nosuch/k", "", []string{"admin"}},
		{"POST", "/v1/ops/partitions/nosuch/k/resume", "", []string{"admin"}},
		{"POST", "/v1/ops/subscriptions/nosuch/order/5/retry", "", []string{"admin"}},
		{"POST", "/v1/ops/outbox/999999/retry", `{"reason":"x"}`, []string{"admin"}},
		{"POST", "/v1/ops/dead-letters/order/nosuch/m-1/replay", `{"reason":"x"}`, []string{"admin"}},
		// The deploy routes: deploy on the module's tenant (by the config,
		// whether the module exists or not), and an admin.
		{"GET", "/v1/modules", "", []string{"shop-deployer", "admin"}},
		{"PUT", "/v1/modules/client_orders", fixtureModule(t, f, "client_orders"), []string{"shop-deployer", "admin"}},
		{"PUT", "/v1/modules/behave", fixtureModule(t, f, "behave"), []string{"admin"}},
		{"DELETE", "/v1/modules/shop_extra", "", []string{"shop-deployer", "admin"}},
		{"DELETE", "/v1/modules/no_such_module", "", []string{"admin"}},
		{"POST", "/v1/modules/client_orders/rollback", "", []string{"shop-deployer", "admin"}},
		{"POST", "/v1/modules/behave/rollback", "", []string{"admin"}},
	}
	var forbidden, unauthorized []string
	for _, r := range routes {
		for _, p := range append([]string{"none", "bad"}, all...) {
			code, body := f.request(t, h, p, r.method, r.path, r.body)
			what := fmt.Sprintf("%s %s as %s: %d %s", r.method, r.path, p, code, body)
			switch {
			case slices.Contains(r.allowed, p):
				require.NotContains(t, []int{401, 403}, code, what)
				require.Less(t, code, 500, what)
			case p == "none" || p == "bad":
				require.Equal(t, 401, code, what)
				unauthorized = append(unauthorized, body)
			default:
				require.Equal(t, 403, code, what)
				forbidden = append(forbidden, body)
			}
		}
	}
	// One answer for each refusal, whatever the route named.
	for _, b := range forbidden {
		require.Equal(t, forbidden[0], b)
	}
	for _, b := range unauthorized {
		require.Equal(t, unauthorized[0], b)
	}
	// The answers a route gives an admin: what the handler says.
	code, _ := f.request(t, h, "admin", "POST", "/v1/commands/NoSuchCommand", `{}`)
	require.Equal(t, 404, code)
	// The projection is eventually consistent: waited for, not timed.
	eventually(t, h, "the order projected, read by shop's reader", func() (bool, string) {
		code, body := f.request(t, h, "shop-read", "GET", "/v1/projections/client_orders/c-1", "")
		return code == 200 && strings.Contains(body, "o-1"), fmt.Sprintf("%d %s", code, body)
	})
	for _, path := range []string{"/v1/ops/outbox/999999/retry", "/v1/ops/partitions/nosuch/k/resume", "/v1/ops/subscriptions/nosuch/order/5/retry",
		"/v1/ops/dead-letters/order/nosuch/m-1/replay"} {
		code, body := f.request(t, h, "admin", "POST", path, "")
		require.Equal(t, 404, code, "POST %s as admin: %s", path, body)
	}
	requireDeployAnswers(t, h, f)
}

// requireDeployAnswers: what the deploy routes answer those they admit.
// A deployer lists its tenant's modules, an admin every one; a module
// the reload rejects answers 422 with its problems and the running
// module keeps serving; a module that is not there, 404; a rollback with
// no earlier version, 409.
func requireDeployAnswers(t *testing.T, h *testHost, f authFixture) {
	names := func(principal string) []string {
		code, body := f.request(t, h, principal, "GET", "/v1/modules", "")
		require.Equal(t, 200, code, body)
		var out struct {
			Modules []struct {
				Name   string `json:"name"`
				Tenant string `json:"tenant"`
			} `json:"modules"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &out))
		var ns []string
		for _, m := range out.Modules {
			ns = append(ns, m.Tenant+"/"+m.Name)
		}
		return ns
	}
	require.Equal(t, []string{"lab/behave", "shop/client_orders", "shop/orders"}, names("admin"))
	require.Equal(t, []string{"shop/client_orders", "shop/orders"}, names("shop-deployer"))

	code, body := f.request(t, h, "shop-deployer", "PUT", "/v1/modules/client_orders", "\x00asm junk")
	require.Equal(t, 422, code, body)
	require.Contains(t, body, `"problems":[{"file":"client_orders.wasm"`)
	code, body = f.request(t, h, "shop-read", "GET", "/v1/projections/client_orders/c-1", "")
	require.Equal(t, 200, code, "the running module keeps serving: %s", body)
	code, body = f.request(t, h, "shop-deployer", "DELETE", "/v1/modules/shop_extra", "")
	require.Equal(t, 404, code, body)
	code, body = f.request(t, h, "shop-deployer", "POST", "/v1/modules/client_orders/rollback", "")
	require.Equal(t, 409, code, body)
	code, body = f.request(t, h, "shop-deployer", "PUT", "/v1/modules/client_orders", fixtureModule(t, f, "client_orders"))
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"outcome":"unchanged"`)
	require.NotContains(t, h.logs.String(), "audit entry not recorded", "each action is in the stores' audit log")
	code, body = f.request(t, h, "shop-deployer", "GET", "/v1/ops/audit", "")
	require.Equal(t, 200, code, body)
	var es []audit.Entry
	require.NoError(t, json.Unmarshal([]byte(body), &es))
	require.NotEmpty(t, es)
	for _, e := range es {
		require.Equal(t, "shop", e.Tenant, "a deployer reads its tenant's entries only: %+v", e)
	}
	require.Equal(t, "modules.put", es[0].Action)
	require.Equal(t, "key:"+auth.KeyID(auth.Hash(f.keys["shop-deployer"])), es[0].Principal)
}

// fixtureModule reads a module's bytes from the fixture's plugins directory.
func fixtureModule(t *testing.T, f authFixture, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.dir, name+".wasm"))
	require.NoError(t, err)
	return string(b)
}

// TestAccessEveryRouteEveryRoleEmbedded: the route × principal table on
// the embedded host (memory stores, inline broker).
func TestAccessEveryRouteEveryRoleEmbedded(t *testing.T) {
	f := newAuthFixture(t)
	h, err := startHostWith(t, "domain.toml", f.dir, f.apply)
	require.NoError(t, err)
	requireAccessTable(t, h, f)
}

// TestAccessEveryRouteEveryRoleOnServers: the same table on PostgreSQL
// and Redis (production.toml).
func TestAccessEveryRouteEveryRoleOnServers(t *testing.T) {
	d := newRedisDeployment(t)
	f := newAuthFixture(t)
	h, err := startHostWith(t, "production.toml", f.dir, func(c *config.Config) { d.fastLeases(c); f.apply(c) })
	require.NoError(t, err)
	requireAccessTable(t, h, f)
}

// TestIdempotencyKeysAreTheTenants: with keys, an Idempotency-Key is the
// sending tenant's: another tenant's request with the same key and type
// is its own, not a replay of the first.
func TestIdempotencyKeysAreTheTenants(t *testing.T) {
	f := newAuthFixture(t)
	h, err := startHostWith(t, "domain.toml", f.dir, f.apply)
	require.NoError(t, err)
	send := func(principal, body string) (int, string, string) {
		req, err := http.NewRequest("POST", "http://"+h.addr+"/v1/commands/Again", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+f.keys[principal])
		req.Header.Set("Idempotency-Key", "k-1")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), string(b)
	}
	code, replayed, body := send("lab-write", `{"id":"a"}`)
	require.Equal(t, 200, code, body)
	require.Empty(t, replayed)
	code, replayed, body = send("lab-write", `{"id":"a"}`)
	require.Equal(t, 200, code, body)
	require.Equal(t, "true", replayed, "the same tenant's repeat is a replay")
	code, replayed, body = send("shop-write", `{"id":"b"}`)
	require.Equal(t, 200, code, "another tenant's key is its own (not a body mismatch): %s", body)
	require.Empty(t, replayed)
}

// TestNonLoopbackWithoutKeysRefusesToStart: serving every interface with
// no keys is refused with the way out in the error, and allowed when the
// config says so explicitly.
func TestNonLoopbackWithoutKeysRefusesToStart(t *testing.T) {
	dir := wasmbuild.Examples(t)
	_, err := startHostWith(t, "domain.toml", dir, func(c *config.Config) { c.HTTP.Listen = "0.0.0.0:0" })
	require.ErrorContains(t, err, "is not a loopback address and [http.auth] has no keys")
	require.ErrorContains(t, err, "protean-host keys new")
	h, err := startHostWith(t, "domain.toml", dir, func(c *config.Config) {
		c.HTTP.Listen = "0.0.0.0:0"
		c.HTTP.Auth.AllowUnauthenticated = true
	})
	require.NoError(t, err)
	require.Equal(t, 200, get(t, h, "/healthz").code)
}

// TestKeysNewPrintsAKeyAndItsConfig: keys new prints a key once and the
// lines that let it in: a host configured with them admits the key.
func TestKeysNewPrintsAKeyAndItsConfig(t *testing.T) {
	code, out, errs := cli(t, "keys", "new", "default", "--role", "admin")
	require.Equal(t, 0, code, errs)
	var key string
	for _, l := range strings.Split(out, "\n") {
		if s := strings.TrimSpace(l); strings.HasPrefix(s, auth.KeyPrefix) {
			key = s
		}
	}
	require.NotEmpty(t, key, out)
	require.Contains(t, out, fmt.Sprintf("sha256 = %q", auth.Hash(key)))
	require.Contains(t, out, `role = "admin"`)
	require.NotContains(t, out[strings.Index(out, "[[http.auth.keys]]"):], key, "the config lines hold only the hash")

	code, _, errs = cli(t, "keys", "new", "shop", "--role", "owner")
	require.NotEqual(t, 0, code)
	require.Contains(t, errs, "unknown role")
	code, _, errs = cli(t, "keys", "new", "--role", "write")
	require.NotEqual(t, 0, code)
	require.Contains(t, errs, "needs a TENANT")
}

// TestOIDCTokensAtTheAPI: a host that accepts OIDC tokens beside API
// keys maps a token's permissions onto the same rule: shop:write sends
// shop's commands and no other tenant's; an admin token reads /metrics;
// a token of another issuer is 401.
func TestOIDCTokensAtTheAPI(t *testing.T) {
	f := newAuthFixture(t)
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	set, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "k1", Algorithm: "RS256", Use: "sig"}}})
	require.NoError(t, err)
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	require.NoError(t, os.WriteFile(jwks, set, 0o600))
	h, err := startHostWith(t, "domain.toml", f.dir, func(c *config.Config) {
		f.apply(c)
		c.HTTP.Auth.OIDC = config.OIDC{Issuer: "https://idp.test", Audience: "protean-host", JWKSFile: jwks}
	})
	require.NoError(t, err)
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: "k1"}},
		(&jose.SignerOptions{}).WithType("JWT"))
	require.NoError(t, err)
	token := func(iss string, perms ...string) string {
		now := time.Now()
		tok, err := jwt.Signed(signer).Claims(map[string]any{"iss": iss, "aud": "protean-host", "sub": "alice",
			"exp": now.Add(time.Hour).Unix(), "permissions": perms}).Serialize()
		require.NoError(t, err)
		return tok
	}
	call := func(tok, method, path, body string) int {
		req, err := http.NewRequest(method, "http://"+h.addr+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	shop := token("https://idp.test", "shop:write")
	require.Equal(t, 200, call(shop, "POST", "/v1/commands/PlaceOrder", `{"order_id":"o-9","client_id":"c-9","total":1}`))
	require.Equal(t, 403, call(shop, "POST", "/v1/commands/Increment", `{"id":"x"}`))
	require.Equal(t, 403, call(shop, "GET", "/metrics", ""))
	require.Equal(t, 200, call(token("https://idp.test", "*:admin"), "GET", "/metrics", ""))
	require.Equal(t, 401, call(token("https://evil.test", "*:admin"), "GET", "/metrics", ""))
	// API keys still work beside tokens.
	code, _ := f.request(t, h, "lab-write", "POST", "/v1/commands/Increment", `{"id":"y"}`)
	require.Equal(t, 200, code)
}

// TestAdminListenerSplitsTheRoutes: with [http] admin_listen, clients'
// routes (commands, projections) stay on listen and the admin routes
// (status page, metrics, plugins, operations, deploys) move to the admin
// listener; each answers 404 for the other's, naming where they are;
// /healthz is on both, and credentials apply on both.
func TestAdminListenerSplitsTheRoutes(t *testing.T) {
	f := newAuthFixture(t)
	h, err := startHostWith(t, "domain.toml", f.dir, func(c *config.Config) {
		f.apply(c)
		c.HTTP.AdminListen = "127.0.0.1:0"
	})
	require.NoError(t, err)
	require.NotEqual(t, h.addr, h.adminAddr)
	for _, r := range []struct {
		addr, principal, method, path, body string
		code                                int
		says                                string
	}{
		{h.addr, "shop-write", "POST", "/v1/commands/PlaceOrder", `{"order_id":"o-1","client_id":"c-1","total":1}`, 200, ""},
		{h.addr, "none", "GET", "/healthz", "", 200, ""},
		{h.addr, "admin", "GET", "/", "", 404, "served on [http] admin_listen"},
		{h.addr, "admin", "GET", "/metrics", "", 404, "served on [http] admin_listen"},
		{h.addr, "admin", "GET", "/v1/plugins", "", 404, "served on [http] admin_listen"},
		{h.addr, "admin", "GET", "/v1/ops/partitions", "", 404, "served on [http] admin_listen"},
		{h.addr, "admin", "PUT", "/v1/modules/client_orders", "x", 404, "served on [http] admin_listen"},
		{h.adminAddr, "admin", "GET", "/", "", 200, "protean-host"},
		{h.adminAddr, "admin", "GET", "/metrics", "", 200, "protean_http_requests_total"},
		{h.adminAddr, "admin", "GET", "/v1/plugins", "", 200, "client_orders"},
		{h.adminAddr, "shop-operator", "GET", "/v1/ops/audit", "", 200, ""},
		{h.adminAddr, "shop-deployer", "GET", "/v1/modules", "", 200, "client_orders"},
		{h.adminAddr, "none", "GET", "/healthz", "", 200, ""},
		{h.adminAddr, "none", "GET", "/", "", 401, ""},
		{h.adminAddr, "lab-operator", "GET", "/v1/modules", "", 403, ""},
		{h.adminAddr, "shop-write", "POST", "/v1/commands/PlaceOrder", `{"order_id":"o-2","client_id":"c-1","total":1}`, 404, "served on [http] listen"},
		{h.adminAddr, "shop-read", "GET", "/v1/projections/client_orders/c-1", "", 404, "served on [http] listen"},
	} {
		code, body := f.requestAt(t, r.addr, r.principal, r.method, r.path, r.body)
		require.Equal(t, r.code, code, "%s %s on %s as %s: %s", r.method, r.path, r.addr, r.principal, body)
		require.Contains(t, body, r.says, "%s %s on %s", r.method, r.path, r.addr)
	}
	// The projection is read on the API listener, once the order is in it
	// (eventually consistent: waited for, not timed).
	eventually(t, h, "the order projected, read on the API listener", func() (bool, string) {
		code, body := f.requestAt(t, h.addr, "shop-read", "GET", "/v1/projections/client_orders/c-1", "")
		return code == 200 && strings.Contains(body, "o-1"), fmt.Sprintf("%d %s", code, body)
	})
	require.Contains(t, h.logs.String(), "admin_addr="+h.adminAddr)
}
