package auth

import (
	"slices"
	"sync/atomic"
)

// Live is the authenticator in force, which a reload replaces whole: a
// request loads it once and checks its credential against that one set,
// so no request sees a set half built or half old, and requests in flight
// finish with the set they loaded. The zero Live, like a nil one, holds
// nil: no credential, every request let through (a loopback-only host).
type Live struct {
	p atomic.Pointer[Authenticator]
}

// NewLive returns a Live holding a.
func NewLive(a *Authenticator) *Live {
	l := &Live{}
	l.p.Store(a)
	return l
}

// Load returns the authenticator in force (nil: none).
func (l *Live) Load() *Authenticator {
	if l == nil {
		return nil
	}
	return l.p.Load()
}

// Store makes a the authenticator in force for every request that loads
// it after.
func (l *Live) Store(a *Authenticator) { l.p.Store(a) }

// Swap makes a the authenticator in force and returns the one it
// replaces.
func (l *Live) Swap(a *Authenticator) *Authenticator { return l.p.Swap(a) }

// KeyIDs lists the ids (KeyID) of the API keys a knows, sorted; none for
// a nil a.
func (a *Authenticator) KeyIDs() []string {
	if a == nil || a.Keys == nil {
		return nil
	}
	return a.Keys.IDs()
}

// IDs lists the ids (KeyID) of the keys k knows, sorted: what a log may
// name of them.
func (k *Keys) IDs() []string {
	out := make([]string, 0, len(k.byHash))
	for _, p := range k.byHash {
		out = append(out, p.Key)
	}
	slices.Sort(out)
	return out
}

// KeyChanges lists the key ids in next and not in prev (added), and in
// prev and not in next (removed), each sorted.
func KeyChanges(prev, next *Authenticator) (added, removed []string) {
	was, is := prev.KeyIDs(), next.KeyIDs()
	for _, id := range is {
		if !slices.Contains(was, id) {
			added = append(added, id)
		}
	}
	for _, id := range was {
		if !slices.Contains(is, id) {
			removed = append(removed, id)
		}
	}
	return added, removed
}
