package host_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
)

// Manifests for the tenant rules, written by hand: validation reads only
// declarations.
func shop() *abi.Manifest {
	return &abi.Manifest{ABIVersion: abi.Version, Module: abi.ModuleInfo{Name: "orders"},
		Messages: []abi.Message{
			{Type: "PlaceOrder", Kind: abi.MessageCommand, Category: "order"},
			{Type: "CancelOrder", Kind: abi.MessageCommand, Category: "order"},
			{Type: "OrderPlaced", Kind: abi.MessageEvent, Category: "order"},
		},
		Handlers: []abi.Handler{{Name: "orders", Kind: abi.KindCommandHandler, Category: "order", Handles: []string{"PlaceOrder", "CancelOrder"}}}}
}

func reader(name string) *abi.Manifest {
	return &abi.Manifest{ABIVersion: abi.Version, Module: abi.ModuleInfo{Name: name},
		Messages: []abi.Message{{Type: "OrderPlaced", Kind: abi.MessageEvent, Category: "order"}},
		Handlers: []abi.Handler{{Name: name + "_orders", Kind: abi.KindProjector, Category: "order", Handles: []string{"OrderPlaced"}}}}
}

func TestTenantRules(t *testing.T) {
	readGrant := host.Grants{Read: map[string]map[string][]string{"shop": {"analytics": {"order"}}}}
	forger := &abi.Manifest{ABIVersion: abi.Version, Module: abi.ModuleInfo{Name: "forger"},
		Messages: []abi.Message{{Type: "OrderPlaced", Kind: abi.MessageEvent, Category: "order"}}} // emits, nobody of its own handles it
	hijacker := &abi.Manifest{ABIVersion: abi.Version, Module: abi.ModuleInfo{Name: "hijacker"},
		Messages: []abi.Message{{Type: "Steal", Kind: abi.MessageCommand, Category: "order"}},
		Handlers: []abi.Handler{{Name: "steal", Kind: abi.KindCommandHandler, Category: "order", Handles: []string{"Steal"}}}}
	canceller := &abi.Manifest{ABIVersion: abi.Version, Module: abi.ModuleInfo{Name: "canceller"},
		Messages: []abi.Message{{Type: "CancelOrder", Kind: abi.MessageCommand, Category: "order"}}}
	tests := []struct {
		name   string
		mods   []host.Declared
		grants host.Grants
		want   []string // fragments of the one problem; nil: valid
	}{
		{name: "one tenant's modules cooperate",
			mods: []host.Declared{{File: "orders.wasm", Manifest: shop()}, {File: "analytics.wasm", Manifest: reader("analytics")}}},
		{name: "a subscription to another tenant's category without a grant",
			mods: []host.Declared{{File: "orders.wasm", Manifest: shop(), Tenant: "shop"}, {File: "analytics.wasm", Manifest: reader("analytics"), Tenant: "analytics"}},
			want: []string{"analytics.wasm", "tenant analytics subscribes to OrderPlaced of category order, which tenant shop owns (orders.wasm", "[tenants.shop] grant_read = { analytics = [\"order\"] }"}},
		{name: "a subscription the owner grants",
			mods:   []host.Declared{{File: "orders.wasm", Manifest: shop(), Tenant: "shop"}, {File: "analytics.wasm", Manifest: reader("analytics"), Tenant: "analytics"}},
			grants: readGrant},
		{name: "a grant to another tenant does not cover this one",
			mods:   []host.Declared{{File: "orders.wasm", Manifest: shop(), Tenant: "shop"}, {File: "spy.wasm", Manifest: reader("spy"), Tenant: "spy"}},
			grants: readGrant,
			want:   []string{"spy.wasm", "tenant spy subscribes to OrderPlaced"}},
		{name: "an event of another tenant's category (a forger), even with a read grant",
			mods:   []host.Declared{{File: "orders.wasm", Manifest: shop(), Tenant: "shop"}, {File: "forger.wasm", Manifest: forger, Tenant: "analytics"}},
			grants: readGrant,
			want:   []string{"tenants shop and analytics both claim category order", "orders.wasm", "forger.wasm declares event OrderPlaced"}},
		{name: "a command handler on another tenant's category",
			mods: []host.Declared{{File: "orders.wasm", Manifest: shop(), Tenant: "shop"}, {File: "hijacker.wasm", Manifest: hijacker, Tenant: "evil"}},
			want: []string{"both claim category order", "hijacker.wasm has command handler steal on it", "orders.wasm"}},
		{name: "the later file is blamed whatever the order: files swap, both still named",
			mods: []host.Declared{{File: "hijacker.wasm", Manifest: hijacker, Tenant: "evil"}, {File: "orders.wasm", Manifest: shop(), Tenant: "shop"}},
			want: []string{"both claim category order", "hijacker.wasm has command handler steal on it", "orders.wasm"}},
		{name: "a command of another tenant declared to dispatch it, without a grant",
			mods: []host.Declared{{File: "orders.wasm", Manifest: shop(), Tenant: "shop"}, {File: "canceller.wasm", Manifest: canceller, Tenant: "evil"}},
			want: []string{"canceller.wasm", "tenant evil declares command CancelOrder of category order, which tenant shop owns", "grant_dispatch = { evil = [\"CancelOrder\"] }"}},
		{name: "a command the owner grants",
			mods:   []host.Declared{{File: "orders.wasm", Manifest: shop(), Tenant: "shop"}, {File: "canceller.wasm", Manifest: canceller, Tenant: "evil"}},
			grants: host.Grants{Dispatch: map[string]map[string][]string{"shop": {"evil": {"CancelOrder"}}}}},
		{name: "a category nobody writes belongs to its reader",
			mods: []host.Declared{{File: "analytics.wasm", Manifest: reader("analytics"), Tenant: "analytics"}}},
		{name: "two tenants reading a category nobody writes",
			mods: []host.Declared{{File: "analytics.wasm", Manifest: reader("analytics"), Tenant: "analytics"}, {File: "spy.wasm", Manifest: reader("spy"), Tenant: "spy"}},
			want: []string{"tenants analytics and spy both claim category order"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			owners, problems := host.ValidateTenants(tc.mods, tc.grants)
			if tc.want == nil {
				require.Empty(t, problems)
				return
			}
			require.Len(t, problems, 1, "%v", problems)
			require.Equal(t, host.RuleTenant, problems[0].Rule)
			for _, w := range tc.want {
				require.Contains(t, problems[0].Error(), w)
			}
			_ = owners
		})
	}
}

// TestTenantOwnerIsByDeclarationNotOrder: the owner of a category is the
// tenant that writes it, whichever file loads first.
func TestTenantOwnerIsByDeclarationNotOrder(t *testing.T) {
	g := host.Grants{Read: map[string]map[string][]string{"shop": {"analytics": {"order"}}}}
	for _, order := range [][]host.Declared{
		{{File: "a.wasm", Manifest: reader("analytics"), Tenant: "analytics"}, {File: "z.wasm", Manifest: shop(), Tenant: "shop"}},
		{{File: "a.wasm", Manifest: shop(), Tenant: "shop"}, {File: "z.wasm", Manifest: reader("analytics"), Tenant: "analytics"}},
	} {
		owners, problems := host.ValidateTenants(order, g)
		require.Empty(t, problems)
		owner, ok := owners.Owner("order")
		require.True(t, ok)
		require.Equal(t, "shop", owner, "files %s, %s", order[0].File, order[1].File)
	}
}

// TestNameClashBlamesTheLaterFile: a module or handler name already taken
// is reported against the file that takes it second, naming the first.
func TestNameClashBlamesTheLaterFile(t *testing.T) {
	a, b := reader("analytics"), reader("analytics")
	_, problems := host.Validate([]host.Declared{{File: "a.wasm", Manifest: a}, {File: "b.wasm", Manifest: b}}, inline)
	require.NotEmpty(t, problems)
	for _, p := range problems {
		require.Equal(t, "b.wasm", p.File, p.Error())
		require.Contains(t, p.Error(), "a.wasm")
	}
}
