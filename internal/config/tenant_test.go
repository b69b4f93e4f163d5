package config_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/host"
)

func TestTenancyFromFile(t *testing.T) {
	clearEnv(t)
	c, err := config.Load(writeFile(t, `
[tenants.shop]
modules = ["orders"]
grant_read = { analytics = ["order"], default = ["order"] }
grant_dispatch = { analytics = ["CancelOrder"] }
grant_projections = { analytics = ["client_orders"] }

[tenants.analytics]
modules = ["reports"]
`))
	require.NoError(t, err)
	ten := c.Tenancy()
	require.Equal(t, "shop", ten.Of("orders"))
	require.Equal(t, "analytics", ten.Of("reports"))
	require.Equal(t, host.DefaultTenant, ten.Of("shipping"), "an unlisted module is the default tenant's")
	require.True(t, ten.Grants.CanRead("shop", "analytics", "order"))
	require.True(t, ten.Grants.CanRead("shop", "default", "order"))
	require.False(t, ten.Grants.CanRead("analytics", "shop", "order"))
	require.True(t, ten.Grants.CanDispatch("shop", "analytics", "CancelOrder"))
	require.False(t, ten.Grants.CanDispatch("shop", "analytics", "PlaceOrder"))
	require.True(t, ten.Grants.CanReadProjection("shop", "analytics", "client_orders"))
	require.False(t, ten.Grants.CanReadProjection("shop", "analytics", "totals"))
	require.False(t, ten.Grants.CanReadProjection("analytics", "shop", "client_orders"))
}

func TestTenancyGrantErrors(t *testing.T) {
	clearEnv(t)
	_, err := config.Load(writeFile(t, `
[tenants.shop]
modules = ["orders"]
grant_read = { shop = ["order"], ghost = ["order"], analytics = [""] }
grant_projections = { ghost = ["client_orders"] }

[tenants.analytics]
modules = ["reports"]
`))
	require.Error(t, err)
	msg := err.Error()
	require.Contains(t, msg, "tenants.shop.grant_read.shop grants tenant shop to itself")
	require.Contains(t, msg, "tenants.shop.grant_read.ghost names tenant ghost, which is not a [tenants.ghost] table")
	require.Contains(t, msg, "tenants.shop.grant_read.analytics[0] must not be empty")
	require.Contains(t, msg, "tenants.shop.grant_projections.ghost names tenant ghost")
}

// [tenants.NAME] weight, max_concurrency and calls_per_second reach the
// host's shares, [plugins] guest_concurrency the loader's; unset they are
// the zero values the host reads as its defaults.
func TestSharesFromFile(t *testing.T) {
	clearEnv(t)
	c, err := config.Load(writeFile(t, `
[plugins]
guest_concurrency = 6

[tenants.shop]
modules = ["orders"]
weight = 3
max_concurrency = 2
calls_per_second = 12.5

[tenants.analytics]
modules = ["reports"]
`))
	require.NoError(t, err)
	require.Equal(t, 6, c.Plugins.GuestConcurrency)
	require.Equal(t, map[string]host.ShareOptions{
		"shop":      {Weight: 3, MaxConcurrency: 2, CallsPerSecond: 12.5},
		"analytics": {},
	}, c.Shares())
}

// guest_concurrency 0 shares the slots when the config names tenants, and
// shares nothing on a config that names none (its one tenant would only
// be capped); a value set is kept either way.
func TestGuestSlots(t *testing.T) {
	clearEnv(t)
	none, err := config.Load("")
	require.NoError(t, err)
	require.Equal(t, -1, none.GuestSlots(), "no tenants: no sharing")
	tenants, err := config.Load(writeFile(t, "[tenants.shop]\nmodules = [\"orders\"]\n"))
	require.NoError(t, err)
	require.Equal(t, 0, tenants.GuestSlots(), "tenants: the host's default slots")
	set, err := config.Load(writeFile(t, "[plugins]\nguest_concurrency = 3\n"))
	require.NoError(t, err)
	require.Equal(t, 3, set.GuestSlots(), "set: as set, tenants or not")
}

func TestSharesErrors(t *testing.T) {
	clearEnv(t)
	_, err := config.Load(writeFile(t, `
[plugins]
guest_concurrency = -2

[tenants.shop]
modules = ["orders"]
weight = -1
max_concurrency = -1
calls_per_second = -0.5
`))
	require.Error(t, err)
	msg := err.Error()
	require.Contains(t, msg, "plugins.guest_concurrency must be >= -1 (got -2")
	require.Contains(t, msg, "tenants.shop.weight must be >= 0 (got -1")
	require.Contains(t, msg, "tenants.shop.max_concurrency must be >= 0 (got -1")
	require.Contains(t, msg, "tenants.shop.calls_per_second must be a number >= 0 (got -0.5")
}
