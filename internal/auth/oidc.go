package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	jose "github.com/go-jose/go-jose/v4"
)

// OIDCOptions configure the verification of OIDC JWT bearer tokens.
type OIDCOptions struct {
	// Issuer is the tokens' iss, exactly.
	Issuer string
	// Audience must be one of the tokens' aud.
	Audience string
	// JWKSURL is where the issuer publishes its signing keys: fetched when
	// a token names a key (kid) not seen yet, so the issuer's rotation
	// needs nothing here. JWKSFile is a JSON Web Key Set on disk instead,
	// read once. Exactly one is set.
	JWKSURL, JWKSFile string
	// Claim names the claim that lists the token's permissions as
	// "TENANT:ROLE" (default "permissions"; "*:admin" is the admin role).
	Claim string
	// Skew is the clock skew allowed on exp (default DefaultSkew); nbf
	// allows five minutes, as the library does.
	Skew time.Duration
	// Now is the time a token is checked at (nil: time.Now).
	Now func() time.Time
	// Client fetches JWKSURL (nil: http.DefaultClient).
	Client *http.Client
	// RefetchEvery is the least time between two fetches of JWKSURL
	// (default DefaultRefetchEvery): a token naming a key not in the set
	// fetched last is refused without a fetch within it.
	RefetchEvery time.Duration
}

// DefaultRefetchEvery is the least time between two fetches of a JWKS
// URL. A client can name any kid it likes in a token, and the claims a
// verifier checks before the signature (iss, aud, exp) are the client's
// to write: without a bound, each such token would be a request to the
// identity provider.
const DefaultRefetchEvery = 10 * time.Second

// DefaultSkew is the clock skew allowed on a token's expiry.
const DefaultSkew = time.Minute

// DefaultClaim is the claim of a token's permissions.
const DefaultClaim = "permissions"

// Algorithms are the signature algorithms a token may use: asymmetric
// only (a shared secret would let whoever verifies also sign).
var Algorithms = []string{oidc.RS256, oidc.RS384, oidc.RS512, oidc.ES256, oidc.ES384, oidc.ES512,
	oidc.PS256, oidc.PS384, oidc.PS512, oidc.EdDSA}

// signatureAlgs are Algorithms as go-jose takes them.
var signatureAlgs = func() []jose.SignatureAlgorithm {
	out := make([]jose.SignatureAlgorithm, len(Algorithms))
	for i, a := range Algorithms {
		out[i] = jose.SignatureAlgorithm(a)
	}
	return out
}()

// OIDC verifies JWT bearer tokens of one issuer and maps their
// permissions claim onto grants.
type OIDC struct {
	verifier *oidc.IDTokenVerifier
	claim    string
	opts     OIDCOptions // as given to NewOIDC, defaults set
}

// NewOIDC returns the verifier o describes. The key set of a JWKSFile is
// read here; a JWKSURL is fetched at the first token.
func NewOIDC(o OIDCOptions) (*OIDC, error) {
	if o.Issuer == "" || o.Audience == "" {
		return nil, errors.New("oidc: issuer and audience are required")
	}
	if (o.JWKSURL == "") == (o.JWKSFile == "") {
		return nil, errors.New("oidc: set exactly one of jwks_url and jwks_file")
	}
	o = o.withDefaults()
	now := o.Now
	if now == nil {
		now = time.Now
	}
	var keys oidc.KeySet
	if o.JWKSFile != "" {
		raw, err := os.ReadFile(o.JWKSFile)
		if err != nil {
			return nil, fmt.Errorf("oidc: jwks_file: %w", err)
		}
		var set jose.JSONWebKeySet
		if err := json.Unmarshal(raw, &set); err != nil {
			return nil, fmt.Errorf("oidc: jwks_file %s: %w", o.JWKSFile, err)
		}
		if len(set.Keys) == 0 {
			return nil, fmt.Errorf("oidc: jwks_file %s holds no key", o.JWKSFile)
		}
		keys = &fileKeys{set: set}
	} else {
		keys = newRemoteKeys(o.JWKSURL, o.Client, now, o.RefetchEvery)
	}
	skew := o.Skew
	v := oidc.NewVerifier(o.Issuer, keys, &oidc.Config{ClientID: o.Audience, SupportedSigningAlgs: Algorithms,
		// exp is checked against Now: checking against Now - skew allows
		// a token skew past its expiry.
		Now: func() time.Time { return now().Add(-skew) }})
	return &OIDC{verifier: v, claim: o.Claim, opts: o}, nil
}

// withDefaults fills o's unset claim, skew and refetch interval.
func (o OIDCOptions) withDefaults() OIDCOptions {
	if o.Claim == "" {
		o.Claim = DefaultClaim
	}
	if o.Skew <= 0 {
		o.Skew = DefaultSkew
	}
	if o.RefetchEvery <= 0 {
		o.RefetchEvery = DefaultRefetchEvery
	}
	return o
}

// Serves reports whether v verifies tokens exactly as NewOIDC(o) would,
// from a key set fetched from a URL: a reload that finds the same
// [http.auth.oidc] keeps v, and the keys it fetched, instead of fetching
// them again. A JWKSFile is never kept: a reload reads the file again.
// (Now and Client are not compared: the host sets neither.)
func (v *OIDC) Serves(o OIDCOptions) bool {
	o = o.withDefaults()
	w := v.opts
	return o.JWKSURL != "" && o.JWKSFile == "" && o.Issuer == w.Issuer && o.Audience == w.Audience &&
		o.JWKSURL == w.JWKSURL && o.JWKSFile == w.JWKSFile && o.Claim == w.Claim && o.Skew == w.Skew &&
		o.RefetchEvery == w.RefetchEvery
}

// Authenticate verifies token (signature by a key of the set, named by
// its kid; iss; aud; exp; nbf) and returns its grants. A token that
// fails is ErrBadCredential, wrapped with why. A valid token whose claim
// lists no permission this host knows is a principal with no grant: every
// route but /healthz answers it 403.
func (v *OIDC) Authenticate(ctx context.Context, token string) (Principal, error) {
	t, err := v.verifier.Verify(ctx, token)
	if err != nil {
		return Principal{}, fmt.Errorf("%w: %v", ErrBadCredential, err)
	}
	var claims map[string]json.RawMessage
	if err := t.Claims(&claims); err != nil {
		return Principal{}, fmt.Errorf("%w: %v", ErrBadCredential, err)
	}
	return Principal{Grants: Permissions(claims[v.claim]), Key: "oidc:" + t.Subject}, nil
}

// Permissions maps a permissions claim onto grants: a list of strings (or
// one string) "TENANT:ROLE", "*:admin" for the admin role. Entries that
// are not of this form, name an unknown role, or give admin to one tenant
// are skipped: a claim may list other applications' permissions too.
func Permissions(raw json.RawMessage) []Grant {
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		var one string
		if json.Unmarshal(raw, &one) != nil {
			return nil
		}
		list = []string{one}
	}
	var out []Grant
	for _, p := range list {
		i := strings.LastIndexByte(p, ':')
		if i <= 0 {
			continue
		}
		tenant := p[:i]
		role, err := ParseRole(p[i+1:])
		if err != nil {
			continue
		}
		switch {
		case role == RoleAdmin && tenant == "*":
			out = append(out, Grant{Role: RoleAdmin})
		case role == RoleAdmin, tenant == "*":
			continue // admin is every tenant's or no one's
		default:
			out = append(out, Grant{Tenant: tenant, Role: role})
		}
	}
	return out
}

// parseJWS parses a compact JWS of one signature by one of
// signatureAlgs and returns it with the key id its header names.
func parseJWS(token string) (*jose.JSONWebSignature, string, error) {
	jws, err := jose.ParseSigned(token, signatureAlgs)
	if err != nil {
		return nil, "", err
	}
	if len(jws.Signatures) != 1 {
		return nil, "", errors.New("want one signature")
	}
	return jws, jws.Signatures[0].Header.KeyID, nil
}

// fileKeys is a key set read from a file. A token must name its key
// (kid), and the set must hold it: a token signed by a key of the set
// under another name is refused.
type fileKeys struct {
	set jose.JSONWebKeySet
}

func (f *fileKeys) VerifySignature(_ context.Context, token string) ([]byte, error) {
	jws, kid, err := parseJWS(token)
	if err != nil {
		return nil, err
	}
	if kid == "" {
		return nil, errors.New("the token names no key (kid)")
	}
	keys := f.set.Key(kid)
	if len(keys) == 0 {
		return nil, fmt.Errorf("unknown key %q", kid)
	}
	for _, k := range keys {
		if payload, err := jws.Verify(k); err == nil {
			return payload, nil
		}
	}
	return nil, errors.New("signature not valid")
}
