package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Role is what a credential may do within its tenant.
type Role string

// The roles. Each includes the ones before it where they overlap: write
// reads too, and admin does everything for every tenant.
const (
	// RoleRead reads the tenant's projections.
	RoleRead Role = "read"
	// RoleWrite sends the tenant's commands (and those another tenant
	// grants it to dispatch), and reads as RoleRead.
	RoleWrite Role = "write"
	// RoleOperator acts on the tenant's partitions, subscriptions, outbox
	// rows and dead letters.
	RoleOperator Role = "operator"
	// RoleDeployer deploys the tenant's modules.
	RoleDeployer Role = "deployer"
	// RoleAdmin does everything, for every tenant: /metrics, the whole
	// status page, the plugins list.
	RoleAdmin Role = "admin"
)

// Roles lists the roles, in the order the docs give them.
var Roles = []Role{RoleRead, RoleWrite, RoleOperator, RoleDeployer, RoleAdmin}

// ParseRole returns the role named s.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if string(r) == s {
			return r, nil
		}
	}
	return "", fmt.Errorf("unknown role %q (want read, write, operator, deployer or admin)", s)
}

// Action is what a request asks to do.
type Action int

// The actions a route asks for.
const (
	Read Action = iota
	Write
	Operate
	Deploy
	Administer
)

// allows reports whether role r grants action a (within its tenant).
func (r Role) allows(a Action) bool {
	switch r {
	case RoleAdmin:
		return true
	case RoleRead:
		return a == Read
	case RoleWrite:
		return a == Read || a == Write
	case RoleOperator:
		return a == Operate
	case RoleDeployer:
		return a == Deploy
	}
	return false
}

// Grant is one role in one tenant ("" for an admin's, which is every
// tenant's).
type Grant struct {
	Tenant string
	Role   Role
}

// Principal is who a request acts for: the grants of its credential (an
// API key has one; a token as many as its permissions claim lists). Key
// names the credential for metrics and logs, never its secret: an API
// key's id, or a token's issuer and subject.
type Principal struct {
	Grants []Grant
	Key    string
	// APIKey says the credential is an API key (whose last use the
	// metrics show).
	APIKey bool
}

// May reports whether p may do a on tenant's behalf: one of its grants is
// admin's, or is tenant's and its role grants a. Grants between tenants
// (a command another tenant lets this one dispatch) are the caller's to
// check, for the tenants of TenantsFor.
func (p Principal) May(a Action, tenant string) bool {
	for _, g := range p.Grants {
		if g.Role == RoleAdmin || (a != Administer && g.Tenant == tenant && g.Role.allows(a)) {
			return true
		}
	}
	return false
}

// TenantsFor lists the tenants in which p may do a, sorted, without an
// admin's "".
func (p Principal) TenantsFor(a Action) []string {
	var out []string
	for _, g := range p.Grants {
		if g.Tenant != "" && g.Role.allows(a) && !slices.Contains(out, g.Tenant) {
			out = append(out, g.Tenant)
		}
	}
	slices.Sort(out)
	return out
}

// Tenants lists p's tenants, sorted: who p is, as far as tenant-scoped
// state (an idempotency key) goes.
func (p Principal) Tenants() []string {
	var out []string
	for _, g := range p.Grants {
		if g.Tenant != "" && !slices.Contains(out, g.Tenant) {
			out = append(out, g.Tenant)
		}
	}
	slices.Sort(out)
	return out
}

// KeyPrefix starts every API key, so a key is recognisable where it leaks
// (logs, repositories, secret scanners).
const KeyPrefix = "phk_"

// keyBytes is the random part of a key: 32 bytes.
const keyBytes = 32

// NewKey returns a new random API key and its hash, the only form the
// config keeps.
func NewKey() (key, hash string, err error) {
	b := make([]byte, keyBytes)
	if _, err := rand.Read(b); err != nil {
		return "", "", err
	}
	key = KeyPrefix + base64.RawURLEncoding.EncodeToString(b)
	return key, Hash(key), nil
}

// Hash is the SHA-256 of key, in hex: what the config keeps of a key. A
// key is 32 random bytes, so a fast hash is enough: there is nothing to
// guess.
func Hash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// KeyID is the short name of a key's hash (its first 12 hex digits), for
// metrics and logs.
func KeyID(hash string) string {
	if len(hash) > 12 {
		return hash[:12]
	}
	return hash
}

// Key is one configured API key: its tenant, its role and its hash.
type Key struct {
	Tenant string
	Role   Role
	SHA256 string
}

// Errors of Authenticate. Both answer 401; which one it was is logged,
// never told to the client.
var (
	ErrNoCredential  = errors.New("no credential")
	ErrBadCredential = errors.New("credential not valid")
)

// Keys verifies API keys against the configured hashes. The zero Keys
// knows no key.
type Keys struct {
	byHash map[[sha256.Size]byte]Principal
}

// NewKeys returns the verifier of keys. A hash that is not 64 hex digits,
// a role that does not exist, a key without a tenant (but an admin's) or
// a hash given twice is an error naming the entry.
func NewKeys(keys []Key) (*Keys, error) {
	k := &Keys{byHash: map[[sha256.Size]byte]Principal{}}
	for i, c := range keys {
		raw, err := hex.DecodeString(c.SHA256)
		if err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("key %d: sha256 must be 64 hex digits (protean-host keys new prints it)", i)
		}
		if _, err := ParseRole(string(c.Role)); err != nil {
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
		if c.Tenant == "" && c.Role != RoleAdmin {
			return nil, fmt.Errorf("key %d: a %s key needs a tenant", i, c.Role)
		}
		var h [sha256.Size]byte
		copy(h[:], raw)
		if _, dup := k.byHash[h]; dup {
			return nil, fmt.Errorf("key %d: the same key is configured twice", i)
		}
		k.byHash[h] = Principal{Grants: []Grant{{Tenant: c.Tenant, Role: c.Role}}, Key: KeyID(strings.ToLower(c.SHA256)), APIKey: true}
	}
	return k, nil
}

// Len is how many keys k knows.
func (k *Keys) Len() int { return len(k.byHash) }

// Authenticate returns the principal of an API key (what follows
// "Bearer "): a key k does not know is ErrBadCredential. The key is
// compared by its hash: what is compared is no secret.
func (k *Keys) Authenticate(token string) (Principal, error) {
	if !strings.HasPrefix(token, KeyPrefix) {
		return Principal{}, ErrBadCredential
	}
	p, ok := k.byHash[sha256.Sum256([]byte(token))]
	if !ok {
		return Principal{}, ErrBadCredential
	}
	return p, nil
}
