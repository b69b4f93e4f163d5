package auth_test

import (
	"context"
	"crypto/sha256"
	"os"
	"path/filepath"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/auth"
)

// BenchmarkAuthenticate is what a request's credential costs, beside the
// floor of each kind: an API key among 1,000 configured against one
// SHA-256 of the key; an OIDC RS256 token (2048-bit key) against go-jose's
// signature check of the same token alone.
func BenchmarkAuthenticate(b *testing.B) {
	ctx := context.Background()
	var conf []auth.Key
	var key string
	for i := 0; i < 1000; i++ {
		k, h, err := auth.NewKey()
		require.NoError(b, err)
		conf = append(conf, auth.Key{Tenant: "shop", Role: auth.RoleWrite, SHA256: h})
		key = k
	}
	keys, err := auth.NewKeys(conf)
	require.NoError(b, err)
	withKeys := &auth.Authenticator{Keys: keys}

	now := time.Now()
	is := newIssuer(b, "k1")
	path := filepath.Join(b.TempDir(), "jwks.json")
	require.NoError(b, os.WriteFile(path, is.jwks(), 0o600))
	v, err := auth.NewOIDC(auth.OIDCOptions{Issuer: "https://idp.test", Audience: "protean-host", JWKSFile: path,
		Now: func() time.Time { return now }})
	require.NoError(b, err)
	withOIDC := &auth.Authenticator{OIDC: v}
	token := is.sign(b, "k1", "k1", goodClaims(now))
	pub := &is.keys["k1"].PublicKey

	b.Run("raw_sha256_of_the_key", func(b *testing.B) {
		for b.Loop() {
			_ = sha256.Sum256([]byte(key))
		}
	})
	b.Run("api_key", func(b *testing.B) {
		for b.Loop() {
			if _, err := withKeys.Authenticate(ctx, "Bearer "+key); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw_rs256_verify", func(b *testing.B) {
		for b.Loop() {
			sig, err := jose.ParseSigned(token, []jose.SignatureAlgorithm{jose.RS256})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := sig.Verify(pub); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("oidc_token", func(b *testing.B) {
		for b.Loop() {
			if _, err := withOIDC.Authenticate(ctx, "Bearer "+token); err != nil {
				b.Fatal(err)
			}
		}
	})
}
