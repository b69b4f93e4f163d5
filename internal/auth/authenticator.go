package auth

import (
	"context"
	"strings"
)

// Authenticator names the principal of a request's Authorization header:
// an API key ("Bearer phk_…") by Keys, any other bearer token by OIDC.
// Either may be nil.
type Authenticator struct {
	Keys *Keys
	OIDC *OIDC
}

// Enabled reports whether any credential is configured: without one,
// the API lets every request through (a loopback-only host).
func (a *Authenticator) Enabled() bool {
	return a != nil && ((a.Keys != nil && a.Keys.Len() > 0) || a.OIDC != nil)
}

// Authenticate returns the principal of header: ErrNoCredential when it
// is empty, ErrBadCredential (wrapped with why, for the log) when it is
// not a bearer credential a configured source accepts.
func (a *Authenticator) Authenticate(ctx context.Context, header string) (Principal, error) {
	if header == "" {
		return Principal{}, ErrNoCredential
	}
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return Principal{}, ErrBadCredential
	}
	if strings.HasPrefix(token, KeyPrefix) {
		if a.Keys == nil {
			return Principal{}, ErrBadCredential
		}
		return a.Keys.Authenticate(token)
	}
	if a.OIDC == nil {
		return Principal{}, ErrBadCredential
	}
	return a.OIDC.Authenticate(ctx, token)
}
