package auth_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/auth"
)

// issuer is a test identity provider: signing keys by kid, and the JWKS
// it publishes.
type issuer struct {
	mu   sync.Mutex
	keys map[string]*rsa.PrivateKey
	pub  []string // the kids the JWKS publishes
}

func newIssuer(t testing.TB, kids ...string) *issuer {
	t.Helper()
	is := &issuer{keys: map[string]*rsa.PrivateKey{}}
	for _, k := range kids {
		is.addKey(t, k)
	}
	is.publish(kids...)
	return is
}

func (is *issuer) addKey(t testing.TB, kid string) {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	is.mu.Lock()
	defer is.mu.Unlock()
	is.keys[kid] = k
}

func (is *issuer) publish(kids ...string) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.pub = kids
}

func (is *issuer) jwks() []byte {
	is.mu.Lock()
	defer is.mu.Unlock()
	var set jose.JSONWebKeySet
	for _, kid := range is.pub {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: &is.keys[kid].PublicKey, KeyID: kid, Algorithm: "RS256", Use: "sig"})
	}
	b, _ := json.Marshal(set)
	return b
}

// claims of a good token: issuer "https://idp.test", audience
// "protean-host", valid for a minute around now.
func goodClaims(now time.Time) map[string]any {
	return map[string]any{"iss": "https://idp.test", "aud": []string{"protean-host", "other"}, "sub": "alice",
		"exp": now.Add(time.Minute).Unix(), "nbf": now.Add(-time.Minute).Unix(), "iat": now.Unix(),
		"permissions": []string{"shop:write", "lab:read", "crm:owner", "shop:admin", "elsewhere"}}
}

// sign signs claims with the key kid (signKid names the key used, which
// may differ from the kid the header names).
func (is *issuer) sign(t testing.TB, headerKid, signKid string, claims map[string]any) string {
	t.Helper()
	is.mu.Lock()
	key := is.keys[signKid]
	is.mu.Unlock()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: headerKid}},
		(&jose.SignerOptions{}).WithType("JWT"))
	require.NoError(t, err)
	tok, err := jwt.Signed(s).Claims(claims).Serialize()
	require.NoError(t, err)
	return tok
}

func TestOIDCChecksEveryClaimAndTheSignature(t *testing.T) {
	now := time.Now()
	is := newIssuer(t, "k1")
	is.addKey(t, "rogue") // never published
	path := filepath.Join(t.TempDir(), "jwks.json")
	require.NoError(t, os.WriteFile(path, is.jwks(), 0o600))
	v, err := auth.NewOIDC(auth.OIDCOptions{Issuer: "https://idp.test", Audience: "protean-host", JWKSFile: path,
		Skew: 30 * time.Second, Now: func() time.Time { return now }})
	require.NoError(t, err)
	a := &auth.Authenticator{OIDC: v}

	p, err := a.Authenticate(context.Background(), "Bearer "+is.sign(t, "k1", "k1", goodClaims(now)))
	require.NoError(t, err)
	require.Equal(t, []auth.Grant{{Tenant: "shop", Role: auth.RoleWrite}, {Tenant: "lab", Role: auth.RoleRead}}, p.Grants,
		"unknown roles, a one-tenant admin and malformed entries are skipped")
	require.Equal(t, "oidc:alice", p.Key)
	require.False(t, p.APIKey)

	with := func(k string, val any) map[string]any {
		c := goodClaims(now)
		if val == nil {
			delete(c, k)
		} else {
			c[k] = val
		}
		return c
	}
	for name, tok := range map[string]string{
		"wrong issuer":          is.sign(t, "k1", "k1", with("iss", "https://evil.test")),
		"wrong audience":        is.sign(t, "k1", "k1", with("aud", []string{"someone-else"})),
		"expired past the skew": is.sign(t, "k1", "k1", with("exp", now.Add(-31*time.Second).Unix())),
		"not before, by far":    is.sign(t, "k1", "k1", with("nbf", now.Add(time.Hour).Unix())),
		"bad signature":         is.sign(t, "k1", "rogue", goodClaims(now)),
		"unknown kid":           is.sign(t, "rogue", "rogue", goodClaims(now)),
		"no kid":                is.sign(t, "", "k1", goodClaims(now)),
		"not a JWT":             "eyJhbGciOiJSUzI1NiJ9.e30.x",
	} {
		_, err := a.Authenticate(context.Background(), "Bearer "+tok)
		require.ErrorIs(t, err, auth.ErrBadCredential, name)
	}
	_, err = a.Authenticate(context.Background(), "Bearer "+is.sign(t, "k1", "k1", with("exp", now.Add(-29*time.Second).Unix())))
	require.NoError(t, err, "expired within the skew")

	// A valid token whose claim grants nothing here: a principal without
	// grants (403 on every route).
	p, err = a.Authenticate(context.Background(), "Bearer "+is.sign(t, "k1", "k1", with("permissions", nil)))
	require.NoError(t, err)
	require.Empty(t, p.Grants)
	// The admin form, and a custom claim name.
	v2, err := auth.NewOIDC(auth.OIDCOptions{Issuer: "https://idp.test", Audience: "protean-host", JWKSFile: path,
		Claim: "roles", Now: func() time.Time { return now }})
	require.NoError(t, err)
	p, err = v2.Authenticate(context.Background(), is.sign(t, "k1", "k1", with("roles", "*:admin")))
	require.NoError(t, err)
	require.Equal(t, []auth.Grant{{Role: auth.RoleAdmin}}, p.Grants)
}

// testClock is a time a test moves on.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// jwksServer publishes is's key set and counts its fetches.
type jwksServer struct {
	*httptest.Server
	mu      sync.Mutex
	fetches int
	fail    bool // answer 500
}

func newJWKSServer(t *testing.T, is *issuer) *jwksServer {
	s := &jwksServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		s.fetches++
		fail := s.fail
		s.mu.Unlock()
		if fail {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(is.jwks())
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetches
}

func (s *jwksServer) failing(f bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = f
}

// TestOIDCFollowsTheIssuersKeyRotation: a token signed by a key the
// issuer published after the host started is accepted (the JWKS is
// fetched again for an unknown kid, once the last fetch is
// RefetchEvery old); once the issuer drops a key, its tokens are refused.
func TestOIDCFollowsTheIssuersKeyRotation(t *testing.T) {
	clk := &testClock{now: time.Now()}
	is := newIssuer(t, "k1")
	srv := newJWKSServer(t, is)
	v, err := auth.NewOIDC(auth.OIDCOptions{Issuer: "https://idp.test", Audience: "protean-host", JWKSURL: srv.URL,
		Client: srv.Client(), Now: clk.Now})
	require.NoError(t, err)
	_, err = v.Authenticate(context.Background(), is.sign(t, "k1", "k1", goodClaims(clk.Now())))
	require.NoError(t, err)

	// The issuer rotates: k2 is published beside k1, then k1 is dropped.
	is.addKey(t, "k2")
	is.publish("k1", "k2")
	clk.Add(auth.DefaultRefetchEvery)
	_, err = v.Authenticate(context.Background(), is.sign(t, "k2", "k2", goodClaims(clk.Now())))
	require.NoError(t, err, "a token of the new key")
	is.publish("k2")
	_, err = v.Authenticate(context.Background(), is.sign(t, "k2", "k2", goodClaims(clk.Now())))
	require.NoError(t, err)
	is.addKey(t, "k3") // forces a fetch that drops k1 from the cache
	is.publish("k2", "k3")
	clk.Add(auth.DefaultRefetchEvery)
	_, err = v.Authenticate(context.Background(), is.sign(t, "k3", "k3", goodClaims(clk.Now())))
	require.NoError(t, err)
	_, err = v.Authenticate(context.Background(), is.sign(t, "k1", "k1", goodClaims(clk.Now())))
	require.ErrorIs(t, err, auth.ErrBadCredential, "a token of a key the issuer dropped")
	require.Equal(t, 3, srv.count())
}

// TestOIDCRefetchIsLimited: tokens naming keys the set does not hold
// (random kids, sprayed by a client) make at most one fetch of the JWKS
// per RefetchEvery, and concurrent ones share it; within the window they
// are refused without a fetch. A failed fetch counts too: an identity
// provider that is down is not hammered either.
func TestOIDCRefetchIsLimited(t *testing.T) {
	clk := &testClock{now: time.Now()}
	is := newIssuer(t, "k1")
	is.addKey(t, "rogue") // never published: signs the sprayed tokens
	srv := newJWKSServer(t, is)
	v, err := auth.NewOIDC(auth.OIDCOptions{Issuer: "https://idp.test", Audience: "protean-host", JWKSURL: srv.URL,
		Client: srv.Client(), Now: clk.Now})
	require.NoError(t, err)
	spray := func(n int) []error {
		toks := make([]string, n)
		for i := range toks {
			toks[i] = is.sign(t, fmt.Sprintf("random-%d", i), "rogue", goodClaims(clk.Now()))
		}
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i, tok := range toks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = v.Authenticate(context.Background(), tok)
			}()
		}
		wg.Wait()
		return errs
	}
	for _, err := range spray(50) {
		require.ErrorIs(t, err, auth.ErrBadCredential)
	}
	require.Equal(t, 1, srv.count(), "the first tokens share one fetch")
	_, err = v.Authenticate(context.Background(), is.sign(t, "k1", "k1", goodClaims(clk.Now())))
	require.NoError(t, err, "a known key needs no fetch")
	errs := spray(50)
	require.Equal(t, 1, srv.count(), "within the window: no fetch")
	require.ErrorContains(t, errs[0], auth.ErrRefetchLimited.Error())

	// Past the window, one fetch for all of them, and a new key of the
	// issuer's is accepted by it.
	clk.Add(auth.DefaultRefetchEvery + time.Second)
	is.addKey(t, "k2")
	is.publish("k1", "k2")
	spray(50)
	require.Equal(t, 2, srv.count())
	_, err = v.Authenticate(context.Background(), is.sign(t, "k2", "k2", goodClaims(clk.Now())))
	require.NoError(t, err, "the window's fetch brought k2")

	// A fetch that fails counts: the next one waits out the window, and
	// the keys fetched before it stay.
	srv.failing(true)
	clk.Add(auth.DefaultRefetchEvery)
	for _, err := range spray(20) {
		require.ErrorIs(t, err, auth.ErrBadCredential)
	}
	require.Equal(t, 3, srv.count())
	spray(20)
	require.Equal(t, 3, srv.count())
	_, err = v.Authenticate(context.Background(), is.sign(t, "k2", "k2", goodClaims(clk.Now())))
	require.NoError(t, err)
	srv.failing(false)
	is.addKey(t, "k3")
	is.publish("k3")
	clk.Add(auth.DefaultRefetchEvery)
	_, err = v.Authenticate(context.Background(), is.sign(t, "k3", "k3", goodClaims(clk.Now())))
	require.NoError(t, err)
	require.Equal(t, 4, srv.count())
}

// TestOIDCServes: a verifier of a JWKS URL serves the same options again
// (a reload keeps it and its fetched keys), not changed ones, and never a
// JWKS file (a reload reads the file again).
func TestOIDCServes(t *testing.T) {
	o := auth.OIDCOptions{Issuer: "https://idp.test", Audience: "protean-host", JWKSURL: "https://idp.test/jwks"}
	v, err := auth.NewOIDC(o)
	require.NoError(t, err)
	require.True(t, v.Serves(o))
	same := o
	same.Claim, same.Skew = auth.DefaultClaim, auth.DefaultSkew
	require.True(t, v.Serves(same), "defaults spelled out are the same options")
	for name, change := range map[string]func(*auth.OIDCOptions){
		"issuer":   func(o *auth.OIDCOptions) { o.Issuer = "https://other.test" },
		"audience": func(o *auth.OIDCOptions) { o.Audience = "other" },
		"url":      func(o *auth.OIDCOptions) { o.JWKSURL = "https://idp.test/jwks2" },
		"claim":    func(o *auth.OIDCOptions) { o.Claim = "roles" },
		"skew":     func(o *auth.OIDCOptions) { o.Skew = 2 * time.Minute },
	} {
		c := o
		change(&c)
		require.False(t, v.Serves(c), name)
	}
	path := filepath.Join(t.TempDir(), "jwks.json")
	require.NoError(t, os.WriteFile(path, newIssuer(t, "k1").jwks(), 0o600))
	f := auth.OIDCOptions{Issuer: "https://idp.test", Audience: "protean-host", JWKSFile: path}
	fv, err := auth.NewOIDC(f)
	require.NoError(t, err)
	require.False(t, fv.Serves(f))
}

func TestNewOIDCRefusesAnIncompleteConfig(t *testing.T) {
	for name, o := range map[string]auth.OIDCOptions{
		"no issuer":    {Audience: "a", JWKSURL: "https://x"},
		"no audience":  {Issuer: "i", JWKSURL: "https://x"},
		"no key set":   {Issuer: "i", Audience: "a"},
		"two key sets": {Issuer: "i", Audience: "a", JWKSURL: "https://x", JWKSFile: "f"},
		"missing file": {Issuer: "i", Audience: "a", JWKSFile: filepath.Join(t.TempDir(), "none.json")},
	} {
		_, err := auth.NewOIDC(o)
		require.Error(t, err, name)
	}
}
