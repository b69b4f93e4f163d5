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
		name    string
		running []host.Declared // validated first: the ownership a reload replaces
		mods    []host.Declared
		grants  host.Grants
		want    []string // fragments of every problem; nil: valid
		files   []string // the files of the problems, in order; nil: the first's of mods (one problem)
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
			want:   []string{"tenants shop and analytics claim category order, and none of them runs it", "orders.wasm (tenant shop) has command handler orders on it", "forger.wasm (tenant analytics) declares event OrderPlaced"},
			files:  []string{"orders.wasm", "forger.wasm"}},
		{name: "a command handler on another tenant's category, nothing running: each claimant is refused",
			mods:  []host.Declared{{File: "orders.wasm", Manifest: shop(), Tenant: "shop"}, {File: "hijacker.wasm", Manifest: hijacker, Tenant: "evil"}},
			want:  []string{"tenants shop and evil claim category order, and none of them runs it", "hijacker.wasm (tenant evil) has command handler steal on it", "orders.wasm (tenant shop)"},
			files: []string{"orders.wasm", "hijacker.wasm"}},
		{name: "files swapped: still each claimant",
			mods:  []host.Declared{{File: "hijacker.wasm", Manifest: hijacker, Tenant: "evil"}, {File: "orders.wasm", Manifest: shop(), Tenant: "shop"}},
			want:  []string{"tenants evil and shop claim category order, and none of them runs it", "hijacker.wasm (tenant evil) has command handler steal on it", "orders.wasm (tenant shop)"},
			files: []string{"hijacker.wasm", "orders.wasm"}},
		{name: "the running owner keeps its category: the newcomer is refused, whichever file sorts first",
			running: []host.Declared{{File: "z_orders.wasm", Manifest: shop(), Tenant: "shop"}},
			mods:    []host.Declared{{File: "a_hijacker.wasm", Manifest: hijacker, Tenant: "evil"}, {File: "z_orders.wasm", Manifest: shop(), Tenant: "shop"}},
			want:    []string{"tenant evil claims category order, which tenant shop owns (z_orders.wasm has command handler orders on it, running): a_hijacker.wasm has command handler steal on it"},
			files:   []string{"a_hijacker.wasm"}},
		{name: "the running owner keeps its category: files swapped",
			running: []host.Declared{{File: "a_orders.wasm", Manifest: shop(), Tenant: "shop"}},
			mods:    []host.Declared{{File: "a_orders.wasm", Manifest: shop(), Tenant: "shop"}, {File: "z_hijacker.wasm", Manifest: hijacker, Tenant: "evil"}},
			want:    []string{"tenant evil claims category order, which tenant shop owns (a_orders.wasm has command handler orders on it, running): z_hijacker.wasm has command handler steal on it"},
			files:   []string{"z_hijacker.wasm"}},
		{name: "the running owner's module in another file of the same tenant still owns it",
			running: []host.Declared{{File: "orders.wasm", Manifest: shop(), Tenant: "shop"}},
			mods:    []host.Declared{{File: "hijacker.wasm", Manifest: hijacker, Tenant: "evil"}, {File: "orders_v2.wasm", Manifest: shop(), Tenant: "shop"}},
			want:    []string{"tenant evil claims category order, which tenant shop owns (orders_v2.wasm"},
			files:   []string{"hijacker.wasm"}},
		{name: "an owner that no longer claims it decides nothing: each claimant is refused",
			running: []host.Declared{{File: "orders.wasm", Manifest: shop(), Tenant: "shop"}},
			mods:    []host.Declared{{File: "hijacker.wasm", Manifest: hijacker, Tenant: "evil"}, {File: "forger.wasm", Manifest: forger, Tenant: "analytics"}},
			want:    []string{"tenants evil and analytics claim category order, and none of them runs it"},
			files:   []string{"hijacker.wasm", "forger.wasm"}},
		{name: "a running reader owns a category nobody writes: a second reader is refused",
			running: []host.Declared{{File: "z_analytics.wasm", Manifest: reader("analytics"), Tenant: "analytics"}},
			mods:    []host.Declared{{File: "a_spy.wasm", Manifest: reader("spy"), Tenant: "spy"}, {File: "z_analytics.wasm", Manifest: reader("analytics"), Tenant: "analytics"}},
			want:    []string{"tenant spy claims category order, which tenant analytics owns"},
			files:   []string{"a_spy.wasm"}},
		{name: "a command of another tenant declared to dispatch it, without a grant",
			mods: []host.Declared{{File: "orders.wasm", Manifest: shop(), Tenant: "shop"}, {File: "canceller.wasm", Manifest: canceller, Tenant: "evil"}},
			want: []string{"canceller.wasm", "tenant evil declares command CancelOrder of category order, which tenant shop owns", "grant_dispatch = { evil = [\"CancelOrder\"] }"}},
		{name: "a command the owner grants",
			mods:   []host.Declared{{File: "orders.wasm", Manifest: shop(), Tenant: "shop"}, {File: "canceller.wasm", Manifest: canceller, Tenant: "evil"}},
			grants: host.Grants{Dispatch: map[string]map[string][]string{"shop": {"evil": {"CancelOrder"}}}}},
		{name: "a category nobody writes belongs to its reader",
			mods: []host.Declared{{File: "analytics.wasm", Manifest: reader("analytics"), Tenant: "analytics"}}},
		{name: "two tenants reading a category nobody writes",
			mods:  []host.Declared{{File: "analytics.wasm", Manifest: reader("analytics"), Tenant: "analytics"}, {File: "spy.wasm", Manifest: reader("spy"), Tenant: "spy"}},
			want:  []string{"tenants analytics and spy claim category order"},
			files: []string{"analytics.wasm", "spy.wasm"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var running *host.Ownership
			if tc.running != nil {
				var ps []*host.Problem
				running, ps = host.ValidateTenants(tc.running, tc.grants)
				require.Empty(t, ps)
			}
			_, problems := host.ValidateTenantsOver(running, tc.mods, tc.grants)
			if tc.want == nil {
				require.Empty(t, problems)
				return
			}
			files := tc.files
			if files == nil {
				files = []string{problems[0].File}
			}
			var got []string
			for _, p := range problems {
				got = append(got, p.File)
				require.Equal(t, host.RuleTenant, p.Rule)
				for _, w := range tc.want {
					require.Contains(t, p.Error(), w)
				}
			}
			require.Equal(t, files, got, "%v", problems)
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
