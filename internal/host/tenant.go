package host

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/proteanhq/protean-host/abi"
)

// DefaultTenant is the tenant of every module that no [tenants.NAME]
// modules list names. It is a tenant like any other: it owns what its
// modules declare, and grants and is granted like the others.
const DefaultTenant = "default"

// RuleTenant is the registration rule of tenant ownership: no two tenants
// claim one category (and so its event and command types), and a tenant
// subscribes to, or declares commands of, another tenant's category only
// where that tenant grants it.
const RuleTenant Rule = "tenant"

// Grants are what tenants let other tenants do with what they own. The
// owner grants; the reader cannot take.
type Grants struct {
	// Read[owner][reader] lists the categories of owner whose events
	// reader's modules may subscribe to, whose streams they may read and
	// whose aggregates they may load. Never write.
	Read map[string]map[string][]string
	// Dispatch[owner][reader] lists the command types of owner that
	// reader's modules may dispatch as follow-up commands.
	Dispatch map[string]map[string][]string
	// Projections[owner][reader] lists the projections of owner's
	// modules that reader's read credentials may read at the API.
	Projections map[string]map[string][]string
}

// CanRead reports whether owner lets reader read category.
func (g Grants) CanRead(owner, reader, category string) bool {
	return slices.Contains(g.Read[owner][reader], category)
}

// CanDispatch reports whether owner lets reader dispatch command type typ.
func (g Grants) CanDispatch(owner, reader, typ string) bool {
	return slices.Contains(g.Dispatch[owner][reader], typ)
}

// CanReadProjection reports whether owner lets reader's credentials read
// projection name.
func (g Grants) CanReadProjection(owner, reader, name string) bool {
	return slices.Contains(g.Projections[owner][reader], name)
}

// Tenancy says which tenant each module belongs to and what tenants grant
// each other (config's [tenants.NAME] tables).
type Tenancy struct {
	// Of returns the tenant of a module by file name without ".wasm"; nil,
	// or "", means DefaultTenant.
	Of     func(module string) string
	Grants Grants
}

func (t Tenancy) of(module string) string {
	if t.Of == nil {
		return DefaultTenant
	}
	if n := t.Of(module); n != "" {
		return n
	}
	return DefaultTenant
}

func tenantOf(name string) string {
	if name == "" {
		return DefaultTenant
	}
	return name
}

// Ownership is who owns each category of a validated set. A tenant owns a
// category when one of its modules writes there: declares a command on
// it, handles commands on it, or declares an event on it that none of its
// own subscribers handle (one it can only be emitting). An event a
// module's subscribers handle is a read, unless the category belongs to no
// other tenant, in which case the reader owns it. Event and command types
// belong to the owner of their category; projections and process state to
// the tenant of the module whose handler names them.
type Ownership struct {
	categories map[string]claim
	grants     Grants
}

type claim struct {
	tenant string
	file   string
	what   string // e.g. "declares event OrderPlaced"
}

// Owner returns the tenant owning category.
func (o *Ownership) Owner(category string) (string, bool) {
	if o == nil {
		return "", false
	}
	c, ok := o.categories[category]
	return c.tenant, ok
}

// Grants returns the grants the set was validated with.
func (o *Ownership) Grants() Grants {
	if o == nil {
		return Grants{}
	}
	return o.grants
}

// declaration is one thing a module declares about a category.
type declaration struct {
	tenant, file, category, what string
	typ                          string
	kind                         abi.MessageKind
}

// ValidateTenants applies RuleTenant to a module set: it returns who owns
// each category, and a problem for every file of a category two tenants
// claim, every subscription to another tenant's category without its read
// grant, and every command of another tenant's category a module declares
// (to dispatch it) without its dispatch grant. It is ValidateTenantsOver
// with nothing running: a category two tenants claim is refused to each.
func ValidateTenants(mods []Declared, g Grants) (*Ownership, []*Problem) {
	return ValidateTenantsOver(nil, mods, g)
}

// ValidateTenantsOver is ValidateTenants for a set that replaces running
// (a reload; nil at start). Config names no category's owner, so a
// category two tenants claim stays with the tenant that owns it in
// running, if that tenant still claims it: each file of another tenant
// that claims it is refused, the problem on that file naming the owner.
// When no claimant owns it in running, every claimant's file is refused:
// file names never decide who owns a category.
func ValidateTenantsOver(running *Ownership, mods []Declared, g Grants) (*Ownership, []*Problem) {
	claims, reads, dispatches := tenantDeclarations(mods)
	o := &Ownership{categories: map[string]claim{}, grants: g}
	// Writes claim first, then reads of categories nobody writes: the
	// owner is decided by what the set declares, never by file order.
	owned := map[string]bool{}
	for _, c := range claims {
		owned[c.category] = true
	}
	for _, r := range reads {
		if !owned[r.category] {
			claims = append(claims, r)
		}
	}
	problems := o.settleClaims(claims, running)
	problems = append(problems, o.ungrantedReads(reads, owned)...)
	problems = append(problems, o.ungrantedDispatches(dispatches)...)
	return o, problems
}

// tenantDeclarations sorts what each module declares into claims (its
// command handlers' categories and the messages it neither subscribes to
// nor dispatches), reads (events it subscribes to) and dispatches
// (commands it declares without handling them).
func tenantDeclarations(mods []Declared) (claims, reads, dispatches []declaration) {
	for _, d := range mods {
		t := tenantOf(d.Tenant)
		subscribed := map[string]bool{}
		handled := map[string]bool{}
		for _, h := range d.Manifest.Handlers {
			if h.Kind == abi.KindCommandHandler {
				if h.Category != "" {
					claims = append(claims, declaration{tenant: t, file: d.File, category: h.Category,
						what: fmt.Sprintf("has command handler %s on it", h.Name)})
				}
				for _, typ := range h.Handles {
					handled[typ] = true
				}
				continue
			}
			for _, typ := range h.Handles {
				subscribed[typ] = true
			}
		}
		for _, msg := range d.Manifest.Messages {
			dl := declaration{tenant: t, file: d.File, category: msg.Category, typ: msg.Type, kind: msg.Kind,
				what: fmt.Sprintf("declares %s %s", msg.Kind, msg.Type)}
			switch {
			case msg.Kind == abi.MessageEvent && subscribed[msg.Type]:
				reads = append(reads, dl)
			case msg.Kind == abi.MessageCommand && !handled[msg.Type]:
				dispatches = append(dispatches, dl)
			default:
				claims = append(claims, dl)
			}
		}
	}
	return claims, reads, dispatches
}

// settleClaims gives each category its owner: the tenant of its claims
// when one tenant claims it; when several do, the tenant that owns it in
// running, if it is one of them. It returns a problem for each file of
// every other claimant, or, when no claimant owns the category in
// running, for each claimant's file.
func (o *Ownership) settleClaims(claims []declaration, running *Ownership) []*Problem {
	var problems []*Problem
	byCat := map[string][]declaration{}
	for _, c := range claims {
		byCat[c.category] = append(byCat[c.category], c)
	}
	for _, cat := range slices.Sorted(maps.Keys(byCat)) {
		cs := byCat[cat]
		var tenants []string
		for _, c := range cs {
			if !slices.Contains(tenants, c.tenant) {
				tenants = append(tenants, c.tenant)
			}
		}
		first := cs[0]
		if len(tenants) == 1 {
			o.categories[cat] = claim{tenant: first.tenant, file: first.file, what: first.what}
			continue
		}
		if owner, ok := running.Owner(cat); ok && slices.Contains(tenants, owner) {
			i := slices.IndexFunc(cs, func(c declaration) bool { return c.tenant == owner })
			o.categories[cat] = claim{tenant: owner, file: cs[i].file, what: cs[i].what}
			problems = append(problems, claimedFromOwner(cat, cs[i], cs)...)
			continue
		}
		// Nobody to prefer: the set is invalid; the first claim stands in
		// for the owner only so that the other rules can be checked.
		o.categories[cat] = claim{tenant: first.tenant, file: first.file, what: first.what}
		problems = append(problems, claimedByNone(cat, tenants, cs)...)
	}
	return problems
}

// claimedFromOwner returns a problem for each file of cs whose tenant is
// not owner's, the tenant that owns cat in the running set.
func claimedFromOwner(cat string, owner declaration, cs []declaration) []*Problem {
	var problems []*Problem
	seen := map[string]bool{}
	for _, c := range cs {
		if c.tenant == owner.tenant || seen[c.file] {
			continue
		}
		seen[c.file] = true
		problems = append(problems, &Problem{Rule: RuleTenant, File: c.file, Type: c.typ,
			Msg: fmt.Sprintf("tenant %s claims category %s, which tenant %s owns (%s %s, running): %s %s (a category belongs to one tenant, and stays with the tenant that runs it; another tenant may only read it, where the owner grants it)",
				c.tenant, cat, owner.tenant, owner.file, owner.what, c.file, c.what)})
	}
	return problems
}

// claimedByNone returns a problem for each file of cs, the claims of
// several tenants on cat, none of which owns it in the running set.
func claimedByNone(cat string, tenants []string, cs []declaration) []*Problem {
	var who []string
	var files []declaration
	for _, c := range cs {
		if !slices.ContainsFunc(files, func(d declaration) bool { return d.file == c.file }) {
			files = append(files, c)
			who = append(who, fmt.Sprintf("%s (tenant %s) %s", c.file, c.tenant, c.what))
		}
	}
	var problems []*Problem
	for _, c := range files {
		problems = append(problems, &Problem{Rule: RuleTenant, File: c.file, Type: c.typ,
			Msg: fmt.Sprintf("tenants %s claim category %s, and none of them runs it: %s (a category belongs to one tenant; each claimant is refused until one claims it alone, and that tenant then keeps it; another tenant may only read it, where the owner grants it)",
				joinAnd(tenants), cat, strings.Join(who, "; "))})
	}
	return problems
}

// joinAnd joins "a", "b" and "c" as "a, b and c".
func joinAnd(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// ungrantedReads returns a problem for each subscription to a category
// another tenant writes (owned) without that tenant's read grant.
func (o *Ownership) ungrantedReads(reads []declaration, owned map[string]bool) []*Problem {
	var problems []*Problem
	for _, r := range reads {
		if !owned[r.category] {
			continue // a claim of a category nobody writes: judged in settleClaims
		}
		owner := o.categories[r.category]
		if owner.tenant == r.tenant || o.grants.CanRead(owner.tenant, r.tenant, r.category) {
			continue
		}
		problems = append(problems, &Problem{Rule: RuleTenant, File: r.file, Type: r.typ,
			Msg: fmt.Sprintf("tenant %s subscribes to %s of category %s, which tenant %s owns (%s %s), without a grant: the owner grants it with [tenants.%s] grant_read = { %s = [%q] }",
				r.tenant, r.typ, r.category, owner.tenant, owner.file, owner.what, owner.tenant, r.tenant, r.category)})
	}
	return problems
}

// ungrantedDispatches returns a problem for each command of another
// tenant's category declared without that tenant's dispatch grant.
func (o *Ownership) ungrantedDispatches(dispatches []declaration) []*Problem {
	var problems []*Problem
	for _, d := range dispatches {
		owner, ok := o.categories[d.category]
		if !ok || owner.tenant == d.tenant || o.grants.CanDispatch(owner.tenant, d.tenant, d.typ) {
			continue
		}
		problems = append(problems, &Problem{Rule: RuleTenant, File: d.file, Type: d.typ,
			Msg: fmt.Sprintf("tenant %s declares command %s of category %s, which tenant %s owns (%s %s), without a grant: the owner grants it with [tenants.%s] grant_dispatch = { %s = [%q] }",
				d.tenant, d.typ, d.category, owner.tenant, owner.file, owner.what, owner.tenant, d.tenant, d.typ)})
	}
	return problems
}
