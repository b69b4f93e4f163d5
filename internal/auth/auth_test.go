package auth_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/auth"
)

func TestNewKeyIsRandomPrefixedAndHashed(t *testing.T) {
	k1, h1, err := auth.NewKey()
	require.NoError(t, err)
	k2, h2, err := auth.NewKey()
	require.NoError(t, err)
	require.NotEqual(t, k1, k2)
	require.True(t, strings.HasPrefix(k1, auth.KeyPrefix))
	require.Len(t, k1, len(auth.KeyPrefix)+43, "32 random bytes, base64url")
	require.Equal(t, auth.Hash(k1), h1)
	require.Len(t, h2, 64)
	require.NotContains(t, h1, k1)
}

func TestAuthenticate(t *testing.T) {
	key, hash, err := auth.NewKey()
	require.NoError(t, err)
	old, oldHash, err := auth.NewKey()
	require.NoError(t, err)
	ks, err := auth.NewKeys([]auth.Key{{Tenant: "shop", Role: auth.RoleWrite, SHA256: hash}, {Tenant: "shop", Role: auth.RoleWrite, SHA256: strings.ToUpper(oldHash)}})
	require.NoError(t, err)
	a := &auth.Authenticator{Keys: ks}
	for _, h := range []string{"Bearer " + key, "bearer " + key, "Bearer " + old} {
		p, err := a.Authenticate(context.Background(), h)
		require.NoError(t, err, h)
		require.Equal(t, []auth.Grant{{Tenant: "shop", Role: auth.RoleWrite}}, p.Grants)
		require.True(t, p.APIKey)
		require.Len(t, p.Key, 12)
		require.NotContains(t, key, p.Key, "the key id is of the hash, not the key")
	}
	_, err = a.Authenticate(context.Background(), "")
	require.ErrorIs(t, err, auth.ErrNoCredential)
	other, _, err := auth.NewKey()
	require.NoError(t, err)
	for _, h := range []string{"Bearer " + other, "Basic " + key, key, "Bearer " + strings.TrimPrefix(key, auth.KeyPrefix), "Bearer", "Bearer eyJhbGciOi.x.y"} {
		_, err = a.Authenticate(context.Background(), h)
		require.ErrorIs(t, err, auth.ErrBadCredential, h)
	}
}

func TestNewKeysRejectsBadEntries(t *testing.T) {
	_, hash, err := auth.NewKey()
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		keys []auth.Key
		want string
	}{
		"short hash":   {[]auth.Key{{Tenant: "a", Role: auth.RoleRead, SHA256: "abc"}}, "64 hex digits"},
		"not hex":      {[]auth.Key{{Tenant: "a", Role: auth.RoleRead, SHA256: strings.Repeat("z", 64)}}, "64 hex digits"},
		"unknown role": {[]auth.Key{{Tenant: "a", Role: "owner", SHA256: hash}}, "unknown role"},
		"no tenant":    {[]auth.Key{{Role: auth.RoleWrite, SHA256: hash}}, "needs a tenant"},
		"the same key": {[]auth.Key{{Tenant: "a", Role: auth.RoleRead, SHA256: hash}, {Tenant: "b", Role: auth.RoleAdmin, SHA256: hash}}, "twice"},
	} {
		_, err := auth.NewKeys(tc.keys)
		require.ErrorContains(t, err, tc.want, name)
	}
	_, err = auth.NewKeys([]auth.Key{{Role: auth.RoleAdmin, SHA256: hash}})
	require.NoError(t, err, "an admin key needs no tenant")
}

// TestMay is the one rule: a role acts within its tenant, for what it
// grants; admin for everything.
func TestMay(t *testing.T) {
	actions := []auth.Action{auth.Read, auth.Write, auth.Operate, auth.Deploy, auth.Administer}
	want := map[auth.Role][]bool{
		auth.RoleRead:     {true, false, false, false, false},
		auth.RoleWrite:    {true, true, false, false, false},
		auth.RoleOperator: {false, false, true, false, false},
		auth.RoleDeployer: {false, false, false, true, false},
		auth.RoleAdmin:    {true, true, true, true, true},
	}
	for role, allowed := range want {
		p := auth.Principal{Grants: []auth.Grant{{Tenant: "shop", Role: role}}}
		for i, a := range actions {
			require.Equal(t, allowed[i], p.May(a, "shop"), "%s action %d on its tenant", role, a)
			require.Equal(t, role == auth.RoleAdmin, p.May(a, "lab"), "%s action %d on another tenant", role, a)
		}
	}
}

func TestTenantsFor(t *testing.T) {
	p := auth.Principal{Grants: []auth.Grant{{Tenant: "shop", Role: auth.RoleRead}, {Tenant: "lab", Role: auth.RoleWrite}, {Tenant: "lab", Role: auth.RoleRead}}}
	require.Equal(t, []string{"lab"}, p.TenantsFor(auth.Write))
	require.Equal(t, []string{"lab", "shop"}, p.TenantsFor(auth.Read))
	require.Equal(t, []string{"lab", "shop"}, p.Tenants())
	require.True(t, p.May(auth.Write, "lab"))
	require.False(t, p.May(auth.Write, "shop"))
	require.False(t, auth.Principal{}.May(auth.Read, ""), "no grant, no access")
}
