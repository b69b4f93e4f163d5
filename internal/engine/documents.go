package engine

import (
	"encoding/json"
	"hash/maphash"
	"slices"
	"sync"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/unitofwork"
)

// DefaultDocumentCacheBytes is the document cache's budget by default
// ([plugins] document_cache_mb).
const DefaultDocumentCacheBytes = 16 << 20

// documentSlotBytes is the budget per slot: the cache has one slot per
// documentSlotBytes of its budget (at least minDocumentSlots).
const (
	documentSlotBytes = 4 << 10
	minDocumentSlots  = 64
	// documentOverhead is what an entry costs beyond its strings and data.
	documentOverhead = 96
)

// documents caches the projection documents that projectors declaring
// documents_by_key committed, per partition unit and lease generation,
// so that the unit's next event loads its document from memory instead
// of the database.
//
// Such a document is written by the events of its key alone (the host
// refuses any other write of it: documentsByKey), so by one unit when
// the projector's events are of one category, and a unit by one owner at
// a time, fenced by its generation. So while this process owns the unit
// at the generation an entry was committed under, the database holds
// exactly the entry's version and bytes (records.data is json, stored as
// written), provided nothing else writes the projection: the cache
// serves only a projector of one category whose module has no other
// projector or process manager (every one of those may write the
// module's projections: cachesDocuments), and a reload starts an empty
// cache (it lives in the loaded set). Should an entry be stale all the
// same (a document edited in the database by hand while its unit runs),
// the worst it does is a version conflict: every write names the version
// it replaces, and a run whose commit fails drops what it wrote, so the
// retry reads the database.
//
// The cache is direct-mapped: each document has one slot (by a hash of
// its projection and id), which a later document of the same slot takes
// over, and it holds at most its budget in bytes; a document larger than
// the budget allows is not kept.
type documents struct {
	mu     sync.Mutex
	seed   maphash.Seed
	slots  []cachedDocument
	bytes  int
	budget int
}

// cachedDocument is a document as a unit committed it.
type cachedDocument struct {
	owner    unitOwner
	typ, id  string
	version  int64
	data     json.RawMessage // nil: deleted (its version kept)
	position int64           // the global position of the event that wrote it
	size     int
	full     bool // the slot holds an entry
}

// unitOwner is a partition unit as one owner holds it.
type unitOwner struct {
	group, unit string
	generation  int64
}

// newDocuments returns a cache holding at most budget bytes; nil (no
// cache) for a budget of 0 or less.
func newDocuments(budget int) *documents {
	if budget <= 0 {
		return nil
	}
	n := max(minDocumentSlots, budget/documentSlotBytes)
	return &documents{seed: maphash.MakeSeed(), slots: make([]cachedDocument, n), budget: budget}
}

func (d *documents) slot(typ, id string) *cachedDocument {
	var h maphash.Hash
	h.SetSeed(d.seed)
	h.WriteString(typ)
	h.WriteByte(0)
	h.WriteString(id)
	return &d.slots[h.Sum64()%uint64(len(d.slots))]
}

// find returns the document typ/id, whoever committed it, if the cache
// holds it.
func (d *documents) find(typ, id string) (cachedDocument, bool) {
	if d == nil {
		return cachedDocument{}, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.slot(typ, id); s.holds(typ, id) {
		return *s, true
	}
	return cachedDocument{}, false
}

// holds reports whether the slot holds the document typ/id.
func (c *cachedDocument) holds(typ, id string) bool { return c.full && c.typ == typ && c.id == id }

// get returns the document typ/id as owner committed it, if the cache
// holds it.
func (d *documents) get(owner unitOwner, typ, id string) (cachedDocument, bool) {
	c, ok := d.find(typ, id)
	if !ok || c.owner != owner {
		return cachedDocument{}, false
	}
	return c, true
}

// put records that owner committed version of typ/id with data (nil:
// deleted) at position. data must not change afterwards.
func (d *documents) put(owner unitOwner, typ, id string, version int64, data json.RawMessage, position int64) {
	if d == nil {
		return
	}
	size := documentOverhead + len(owner.group) + len(owner.unit) + len(typ) + len(id) + len(data)
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.slot(typ, id)
	d.bytes -= s.size
	*s = cachedDocument{}
	if d.bytes+size > d.budget {
		return
	}
	*s = cachedDocument{owner: owner, typ: typ, id: id, version: version, data: data, position: position, size: size, full: true}
	d.bytes += size
}

// asOf returns the document typ/id if the cache holds it as written at
// global position n or later, whoever committed it.
func (d *documents) asOf(typ, id string, n int64) (cachedDocument, bool) {
	c, ok := d.find(typ, id)
	if !ok || c.position < n {
		return cachedDocument{}, false
	}
	return c, true
}

// drop forgets typ/id, whoever committed it.
func (d *documents) drop(typ, id string) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.slot(typ, id); s.holds(typ, id) {
		d.bytes -= s.size
		*s = cachedDocument{}
	}
}

// cachesDocuments reports whether the documents of route's projector may
// be cached: it declares documents_by_key, its module has no other
// projector or process manager that could write them, and it handles the
// events of one category (category names a type's), so that one
// partition unit writes each document (a unit is a category's key: the
// same key in two categories is two units, which would both write it).
func cachesDocuments(route host.Route, category func(typ string) string) bool {
	if !route.Handler.DocumentsByKey || route.Module == nil || route.Module.Manifest == nil {
		return false
	}
	for _, h := range route.Module.Manifest.Handlers {
		if h.Name != route.Handler.Name && (h.Kind == abi.KindProjector || h.Kind == abi.KindProcessManager) {
			return false
		}
	}
	cat := ""
	for _, t := range route.Handler.Handles {
		c := category(t)
		if c == "" || (cat != "" && c != cat) {
			return false
		}
		cat = c
	}
	return cat != ""
}

// cachedProjectors are the projectors of set whose documents may be
// cached (cachesDocuments), by name.
func cachedProjectors(set *host.Set) map[string]bool {
	category := func(typ string) string {
		m, _ := set.Message(typ)
		return m.Category
	}
	out := map[string]bool{}
	for _, m := range set.Modules() {
		if m.Manifest == nil {
			continue
		}
		for _, h := range m.Manifest.Handlers {
			if cachesDocuments(host.Route{Module: m, Handler: h}, category) {
				out[h.Name] = true
			}
		}
	}
	return out
}

// documentView is what one guest call may read from and write to the
// cache: the documents of its projector (typ) as its unit's owner
// committed them. The zero view reads and keeps nothing.
type documentView struct {
	docs  *documents
	owner unitOwner
	typ   string
}

// load answers a load of a projection document from the cache.
func (v documentView) load(req *abi.LoadRequest) (abi.LoadResponse, bool) {
	if v.docs == nil || req.Kind != abi.RecordProjection || req.Type != v.typ {
		return abi.LoadResponse{}, false
	}
	c, ok := v.docs.get(v.owner, req.Type, req.ID)
	if !ok {
		return abi.LoadResponse{}, false
	}
	return abi.LoadResponse{Found: c.data != nil, Version: c.version, Data: c.data}, true
}

// committed keeps the projector's documents a run's changes wrote (change
// j caused by causes[j]), the last write of each; failed drops every one
// of them instead: a commit that failed may or may not have landed
// (ErrCommitUnknown), and a conflict means another version is in the
// database.
func (v documentView) committed(changes []unitofwork.Change, causes []abi.Envelope, failed bool) {
	if v.docs == nil {
		return
	}
	for j, c := range changes {
		if c.Effects == nil {
			continue
		}
		for _, w := range c.Effects.Writes {
			if w.Kind != abi.RecordProjection || w.Type != v.typ {
				continue
			}
			if failed {
				v.docs.drop(w.Type, w.ID)
				continue
			}
			v.docs.put(v.owner, w.Type, w.ID, w.ExpectedVersion+1, slices.Clone(unitofwork.RecordData(w)), causes[j].GlobalPosition)
		}
	}
}

// CachedDocument answers a read of document id of the projector name as of
// global position n (GET ?min_position=n) from the cache, when it holds
// the document as its unit committed it at n or later: such a read needs
// neither the wait nor the database. The document may be older than the
// database's latest (another host has taken its unit over since and
// written it again): a read as of n promises n's effects, which it has,
// not the latest. A deleted document is not answered here (the read then
// finds it missing in the database).
func (e *Engine) CachedDocument(name, id string, n int64) (json.RawMessage, int64, bool) {
	c, ok := e.loaded.Load().docs.asOf(name, id, n)
	if !ok || c.data == nil {
		return nil, 0, false
	}
	return c.data, c.version, true
}
