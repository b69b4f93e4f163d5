package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/record"
)

// countingRecords counts the loads that reach the record store.
type countingRecords struct {
	record.Store
	loads atomic.Int64
}

func (c *countingRecords) Load(ctx context.Context, key record.Key) (record.Record, error) {
	c.loads.Add(1)
	return c.Store.Load(ctx, key)
}

// documentsEngine runs the example modules on memory stores, its record
// loads counted, with a document cache of budget bytes (see
// Options.DocumentCacheBytes).
func documentsEngine(t *testing.T, budget int) (*Engine, *unitofwork.Memory, *countingRecords) {
	t.Helper()
	mem := unitofwork.NewMemory()
	recs := &countingRecords{Store: mem.Records}
	e := New(exampleSet(t), Options{Events: mem.Events, Records: recs, UnitOfWork: unitofwork.New(mem, unitofwork.Options{Broker: "default"}),
		DocumentCacheBytes: budget})
	t.Cleanup(func() { _ = e.Stop(context.Background()) })
	return e, mem, recs
}

// placed is a run of one OrderPlaced of client c1 for client_orders'
// unit, at global position gp, fenced by gen.
func placed(gen, gp int64) delivery.Batch {
	data := fmt.Sprintf(`{"order_id":"o-%d","client_id":"c1","total":1}`, gp)
	return delivery.Batch{Group: "client_orders", Unit: "order:c1", Source: "order:c1", Generation: gen,
		Messages: []delivery.Message{{ID: fmt.Sprintf("e-%d", gp), Type: "OrderPlaced", Category: "order", EventStream: fmt.Sprintf("order-o-%d", gp),
			Data: json.RawMessage(data), GlobalPosition: gp, PartitionKey: "c1"}}}
}

func clientDoc(t *testing.T, mem *unitofwork.Memory) (int64, int) {
	t.Helper()
	r, err := mem.Records.Load(context.Background(), record.Key{Kind: "projection", Type: "client_orders", ID: "c1"})
	require.NoError(t, err)
	var doc struct{ Orders int }
	require.NoError(t, json.Unmarshal(r.Data, &doc))
	return r.Version, doc.Orders
}

// A projector declaring documents_by_key loads the document its unit
// committed from the cache while the unit's owner and generation hold: a
// document changed behind the cache costs one version conflict, after
// which the retry reads the store; a new generation reads the store.
func TestDocumentsServeTheUnitsNextLoad(t *testing.T) {
	e, mem, recs := documentsEngine(t, DefaultDocumentCacheBytes)
	ctx := context.Background()
	h := e.Handler()
	row, err := mem.Positions.Claim(ctx, "client_orders", "order:c1")
	require.NoError(t, err)

	done, err := h.Handle(ctx, placed(row.Generation, 1))
	require.NoError(t, err)
	require.Equal(t, 1, done)
	require.Equal(t, int64(1), recs.loads.Load(), "the first event of the unit reads the store")
	_, err = h.Handle(ctx, placed(row.Generation, 2))
	require.NoError(t, err)
	require.Equal(t, int64(1), recs.loads.Load(), "the next loads what the unit committed, from the cache")
	v, orders := clientDoc(t, mem)
	require.Equal(t, int64(2), v)
	require.Equal(t, 2, orders)

	// Edited by hand behind the cache: the cached version no longer
	// holds, so the run's write conflicts and commits nothing; its retry
	// reads the store.
	require.NoError(t, mem.Records.Commit(ctx, []record.Write{{Key: record.Key{Kind: "projection", Type: "client_orders", ID: "c1"},
		ExpectedVersion: 2, Data: json.RawMessage(`{"client_id":"c1","orders":100,"total":100,"order_ids":[]}`)}}))
	done, err = h.Handle(ctx, placed(row.Generation, 3))
	require.Error(t, err)
	require.True(t, unitofwork.Conflict(err), "%v", err)
	require.Zero(t, done)
	require.Equal(t, int64(1), recs.loads.Load())
	done, err = h.Handle(ctx, placed(row.Generation, 3))
	require.NoError(t, err)
	require.Equal(t, 1, done)
	require.Equal(t, int64(2), recs.loads.Load(), "a failed commit drops what it wrote")
	v, orders = clientDoc(t, mem)
	require.Equal(t, int64(4), v)
	require.Equal(t, 101, orders)

	// Another owner's generation (this process's, after a handover and
	// back) reads the store.
	row, err = mem.Positions.Claim(ctx, "client_orders", "order:c1")
	require.NoError(t, err)
	_, err = h.Handle(ctx, placed(row.Generation, 4))
	require.NoError(t, err)
	require.Equal(t, int64(3), recs.loads.Load())
	_, err = h.Handle(ctx, placed(row.Generation, 5))
	require.NoError(t, err)
	require.Equal(t, int64(3), recs.loads.Load())
	_, orders = clientDoc(t, mem)
	require.Equal(t, 103, orders)

	// A read as of position 5 or before finds the document in the cache;
	// as of 6, not (the unit has not written it there yet).
	for _, n := range []int64{0, 5} {
		data, version, ok := e.CachedDocument("client_orders", "c1", n)
		require.True(t, ok, "as of %d", n)
		require.Equal(t, int64(6), version)
		stored, err := mem.Records.Load(ctx, record.Key{Kind: "projection", Type: "client_orders", ID: "c1"})
		require.NoError(t, err)
		require.Equal(t, string(stored.Data), string(data), "the bytes the database holds")
	}
	_, _, ok := e.CachedDocument("client_orders", "c1", 6)
	require.False(t, ok)
	_, _, ok = e.CachedDocument("client_orders", "c2", 0)
	require.False(t, ok)
}

// With document_cache_mb = 0 every load reads the store.
func TestDocumentsOffReadTheStore(t *testing.T) {
	e, mem, recs := documentsEngine(t, 0)
	ctx := context.Background()
	row, err := mem.Positions.Claim(ctx, "client_orders", "order:c1")
	require.NoError(t, err)
	for gp := int64(1); gp <= 3; gp++ {
		_, err := e.Handler().Handle(ctx, placed(row.Generation, gp))
		require.NoError(t, err)
	}
	require.Equal(t, int64(3), recs.loads.Load())
	_, _, ok := e.CachedDocument("client_orders", "c1", 0)
	require.False(t, ok)
}

// Only a projector declaring documents_by_key whose module has no other
// projector or process manager (each may write the module's projections),
// and whose events are of one category (one unit per key), has its
// documents cached.
func TestCachesDocumentsOnlyForTheirOnlyWriter(t *testing.T) {
	category := func(typ string) string { return map[string]string{"A1": "a", "A2": "a", "B": "b"}[typ] }
	proj := abi.Handler{Name: "p", Kind: abi.KindProjector, DocumentsByKey: true, Handles: []string{"A1", "A2"}}
	route := func(hs ...abi.Handler) host.Route {
		return host.Route{Module: &host.Module{Manifest: &abi.Manifest{Handlers: hs}}, Handler: hs[0]}
	}
	require.True(t, cachesDocuments(route(proj), category))
	require.True(t, cachesDocuments(route(proj, abi.Handler{Name: "c", Kind: abi.KindCommandHandler}), category))
	require.False(t, cachesDocuments(route(proj, abi.Handler{Name: "q", Kind: abi.KindProjector}), category))
	require.False(t, cachesDocuments(route(proj, abi.Handler{Name: "pm", Kind: abi.KindProcessManager}), category))
	two := proj
	two.Handles = []string{"A1", "B"}
	require.False(t, cachesDocuments(route(two), category), "two categories: two units per key")
	plain := proj
	plain.DocumentsByKey = false
	require.False(t, cachesDocuments(route(plain), category))

	require.Equal(t, map[string]bool{"client_orders": true}, cachedProjectors(exampleSet(t)))
}

// The cache answers only the owner and generation that committed a
// document, holds at most its budget, and a document's slot goes to the
// last one put in it.
func TestDocumentsBound(t *testing.T) {
	d := newDocuments(minDocumentSlots * documentSlotBytes)
	u := unitOwner{group: "g", unit: "u", generation: 1}
	d.put(u, "p", "a", 3, json.RawMessage(`{"n":1}`), 10)
	got, ok := d.get(u, "p", "a")
	require.True(t, ok)
	require.Equal(t, int64(3), got.version)
	require.Equal(t, int64(10), got.position)
	_, ok = d.get(unitOwner{group: "g", unit: "u", generation: 2}, "p", "a")
	require.False(t, ok, "another generation")
	_, ok = d.get(u, "p", "b")
	require.False(t, ok)

	d.drop("p", "a")
	_, ok = d.get(u, "p", "a")
	require.False(t, ok)
	require.Zero(t, d.bytes)

	// A document over the budget is not kept, and takes its slot's entry
	// with it.
	d.put(u, "p", "a", 1, json.RawMessage(`{}`), 1)
	d.put(u, "p", "a", 2, json.RawMessage(`"`+strings.Repeat("x", d.budget)+`"`), 2)
	_, ok = d.get(u, "p", "a")
	require.False(t, ok)
	require.Zero(t, d.bytes)

	// Full: the budget holds whatever documents are put.
	for i := range 10 * len(d.slots) {
		d.put(u, "p", fmt.Sprint(i), 1, json.RawMessage(`"`+strings.Repeat("x", 3*documentSlotBytes)+`"`), 1)
		require.LessOrEqual(t, d.bytes, d.budget)
	}
	require.Nil(t, newDocuments(0))
	var none *documents
	_, ok = none.get(u, "p", "a")
	require.False(t, ok)
}
