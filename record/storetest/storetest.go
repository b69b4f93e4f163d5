// Package storetest is the conformance suite for record.Store
// implementations. Every implementation (memory, PostgreSQL) runs it from a
// test of its own:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) storetest.Harness { ... })
//	}
//
// The suite uses only the interfaces below.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/suite"
	"github.com/proteanhq/protean-host/record"
)

// Tx is a transaction on the store under test, as the suite drives it. The
// memory store's *record.MemoryTx fits after a thin adapter; a PostgreSQL
// store wraps its pgx.Tx.
type Tx interface {
	// Load sees the transaction's own writes.
	Load(ctx context.Context, key record.Key) (record.Record, error)
	// Write checks and stages writes, all or nothing.
	Write(ctx context.Context, writes []record.Write) error
	suite.Tx
}

// Harness is one store under test.
type Harness = suite.Harness[record.Store, Tx]

// Run runs the suite. newHarness is called once per subtest, possibly from
// parallel subtests.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	suite.Run(t, map[string]func(t *testing.T, h Harness){
		"LoadMissing":                testLoadMissing,
		"CompareAndSet":              testCompareAndSet,
		"Delete":                     testDelete,
		"KeysAreIndependent":         testKeysAreIndependent,
		"DataIsCopied":               testDataIsCopied,
		"DataIsTheBytesWritten":      testDataIsTheBytesWritten,
		"BatchAllOrNothing":          testBatchAllOrNothing,
		"BatchChainsOnOneKey":        testBatchChains,
		"InvalidInput":               testInvalidInput,
		"CancelledContext":           testCancelledContext,
		"ConcurrentWritersOneWins":   testConcurrentWritersOneWins,
		"NoLostUpdate":               testNoLostUpdate,
		"ConcurrentDisjointKeys":     testConcurrentDisjointKeys,
		"TxReadYourWrites":           testTxReadYourWrites,
		"TxRollbackDiscards":         testTxRollback,
		"TxFailedWriteStagesNothing": testTxFailedWriteStagesNothing,
		"TxDone":                     testTxDone,
	}, func(t *testing.T, fn func(*testing.T, Harness)) { fn(t, newHarness(t)) })
}

func agg(id string) record.Key { return record.Key{Kind: record.KindAggregate, Type: "order", ID: id} }

func doc(n int) json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"n": %d}`, n)) }

func write(key record.Key, expected int64, data json.RawMessage) record.Write {
	return record.Write{Key: key, ExpectedVersion: expected, Data: data}
}

func load(t *testing.T, s interface {
	Load(context.Context, record.Key) (record.Record, error)
}, key record.Key) record.Record {
	t.Helper()
	r, err := s.Load(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, key, r.Key)
	return r
}

func commit(t *testing.T, s record.Store, writes ...record.Write) {
	t.Helper()
	require.NoError(t, s.Commit(t.Context(), writes))
}

// requireRecord checks a record's version and data; data is compared byte
// for byte (a store answers the bytes written), and nil data means none.
func requireRecord(t *testing.T, r record.Record, version int64, data json.RawMessage) {
	t.Helper()
	require.Equal(t, version, r.Version, "version of %s", r.Key)
	if data == nil {
		require.Nil(t, r.Data, "data of %s", r.Key)
		require.False(t, r.Exists())
		return
	}
	require.True(t, r.Exists())
	require.Equal(t, string(data), string(r.Data), "data of %s", r.Key)
}

func requireVersionError(t *testing.T, err error, key record.Key, expected, actual int64) {
	t.Helper()
	require.ErrorIs(t, err, record.ErrExpectedVersion)
	var ve *record.VersionError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, record.VersionError{Key: key, Expected: expected, Actual: actual}, *ve)
}

func testLoadMissing(t *testing.T, h Harness) {
	requireRecord(t, load(t, h.Store, agg("o-1")), 0, nil)
}

func testCompareAndSet(t *testing.T, h Harness) {
	ctx := t.Context()
	k := agg("o-1")
	requireVersionError(t, h.Store.Commit(ctx, []record.Write{write(k, 1, doc(1))}), k, 1, 0)
	commit(t, h.Store, write(k, 0, doc(1)))
	requireRecord(t, load(t, h.Store, k), 1, doc(1))

	requireVersionError(t, h.Store.Commit(ctx, []record.Write{write(k, 0, doc(2))}), k, 0, 1)
	commit(t, h.Store, write(k, 1, doc(2)))
	requireRecord(t, load(t, h.Store, k), 2, doc(2))

	requireVersionError(t, h.Store.Commit(ctx, []record.Write{write(k, 1, doc(3))}), k, 1, 2)
	requireVersionError(t, h.Store.Commit(ctx, []record.Write{write(k, 3, doc(3))}), k, 3, 2)
	requireRecord(t, load(t, h.Store, k), 2, doc(2))

	// Any JSON value is a document.
	commit(t, h.Store, write(k, 2, json.RawMessage(`[1, "two", {"three": 3}]`)))
	requireRecord(t, load(t, h.Store, k), 3, json.RawMessage(`[1, "two", {"three": 3}]`))
}

func testDelete(t *testing.T, h Harness) {
	ctx := t.Context()
	k := agg("o-1")
	commit(t, h.Store, write(k, 0, doc(1)), write(k, 1, doc(2)))

	commit(t, h.Store, write(k, 2, nil))
	requireRecord(t, load(t, h.Store, k), 3, nil)

	// The tombstone keeps the version: a writer that saw the record missing
	// or at an older version cannot write over the delete.
	requireVersionError(t, h.Store.Commit(ctx, []record.Write{write(k, 0, doc(9))}), k, 0, 3)
	requireVersionError(t, h.Store.Commit(ctx, []record.Write{write(k, 2, doc(9))}), k, 2, 3)

	commit(t, h.Store, write(k, 3, doc(4)))
	requireRecord(t, load(t, h.Store, k), 4, doc(4))

	// JSON null deletes too.
	commit(t, h.Store, write(k, 4, json.RawMessage(" null ")))
	requireRecord(t, load(t, h.Store, k), 5, nil)
}

func testKeysAreIndependent(t *testing.T, h Harness) {
	keys := []record.Key{
		{Kind: record.KindAggregate, Type: "order", ID: "1"},
		{Kind: record.KindProjection, Type: "order", ID: "1"},
		{Kind: record.KindAggregate, Type: "orders", ID: "1"},
		{Kind: record.KindAggregate, Type: "order", ID: "2"},
		{Kind: record.KindProcess, Type: "order", ID: "1"},
	}
	for i, k := range keys {
		for v := range i + 1 {
			commit(t, h.Store, write(k, int64(v), doc(i*10+v)))
		}
	}
	for i, k := range keys {
		requireRecord(t, load(t, h.Store, k), int64(i+1), doc(i*10+i))
	}
}

func testDataIsCopied(t *testing.T, h Harness) {
	k := agg("o-1")
	in := doc(1)
	commit(t, h.Store, write(k, 0, in))
	in[2] = 'X'
	r := load(t, h.Store, k)
	r.Data[2] = 'Y'
	requireRecord(t, load(t, h.Store, k), 1, doc(1))
}

// testDataIsTheBytesWritten: a document reads back as the bytes its writer
// wrote, not re-serialized (keys in their order, duplicates and spacing
// kept, numbers as written), whichever way it was written and read, so that
// every store answers a reader the same bytes.
func testDataIsTheBytesWritten(t *testing.T, h Harness) {
	ctx := t.Context()
	docs := []json.RawMessage{
		json.RawMessage(`{"z":1,"a":[1, 2],"n":1.50}`),
		json.RawMessage(` {"total" :42.50e0,"orders":1,"s":"\u00e9\/","k":1,"k":2}` + "\n"),
		json.RawMessage(`[3,1,  2]`),
	}
	for i, d := range docs {
		k := record.Key{Kind: record.KindProjection, Type: "totals", ID: strconv.Itoa(i)}
		commit(t, h.Store, write(k, 0, d))
		requireRecord(t, load(t, h.Store, k), 1, d)
	}

	k := record.Key{Kind: record.KindProjection, Type: "totals", ID: "tx"}
	tx := suite.Begin(t, h.Begin)
	require.NoError(t, tx.Write(ctx, []record.Write{write(k, 0, docs[0]), write(k, 1, docs[1])}))
	requireRecord(t, load(t, tx, k), 2, docs[1])
	require.NoError(t, tx.Commit(ctx))
	requireRecord(t, load(t, h.Store, k), 2, docs[1])
}

func testBatchAllOrNothing(t *testing.T, h Harness) {
	ctx := t.Context()
	a, b, c := agg("a"), agg("b"), agg("c")
	commit(t, h.Store, write(a, 0, doc(1)), write(b, 0, doc(1)))

	err := h.Store.Commit(ctx, []record.Write{
		write(a, 1, doc(2)),
		write(c, 0, doc(2)),
		write(b, 0, doc(2)), // stale
	})
	requireVersionError(t, err, b, 0, 1)
	requireRecord(t, load(t, h.Store, a), 1, doc(1))
	requireRecord(t, load(t, h.Store, b), 1, doc(1))
	requireRecord(t, load(t, h.Store, c), 0, nil)

	err = h.Store.Commit(ctx, []record.Write{
		write(a, 1, doc(2)),
		{Key: record.Key{Kind: record.KindAggregate, Type: "order"}, Data: doc(2)}, // invalid
	})
	require.ErrorIs(t, err, record.ErrInvalid)
	requireRecord(t, load(t, h.Store, a), 1, doc(1))

	commit(t, h.Store, write(a, 1, doc(2)), write(c, 0, doc(2)), write(b, 1, doc(2)))
	for _, k := range []record.Key{a, b, c} {
		require.True(t, load(t, h.Store, k).Exists())
	}
}

func testBatchChains(t *testing.T, h Harness) {
	ctx := t.Context()
	k := agg("o-1")
	commit(t, h.Store, write(k, 0, doc(1)), write(k, 1, doc(2)), write(k, 2, doc(3)))
	requireRecord(t, load(t, h.Store, k), 3, doc(3))

	// The second write must expect the first's new version.
	err := h.Store.Commit(ctx, []record.Write{write(k, 3, doc(4)), write(k, 3, doc(5))})
	requireVersionError(t, err, k, 3, 4)
	requireRecord(t, load(t, h.Store, k), 3, doc(3))

	commit(t, h.Store, write(k, 3, nil), write(k, 4, doc(6)))
	requireRecord(t, load(t, h.Store, k), 5, doc(6))
}

func testInvalidInput(t *testing.T, h Harness) {
	ctx := t.Context()
	for name, w := range map[string]record.Write{
		"empty kind":       write(record.Key{Type: "order", ID: "1"}, 0, doc(1)),
		"empty type":       write(record.Key{Kind: record.KindAggregate, ID: "1"}, 0, doc(1)),
		"empty id":         write(record.Key{Kind: record.KindAggregate, Type: "order"}, 0, doc(1)),
		"negative version": write(agg("1"), -1, doc(1)),
		"data not JSON":    write(agg("1"), 0, json.RawMessage(`{"n":`)),
		// jsonb cannot store U+0000: both stores refuse it before the
		// database, the same way.
		"data holds NUL":              write(agg("1"), 0, json.RawMessage(`{"s":"\u0000"}`)),
		"data holds a lone surrogate": write(agg("1"), 0, json.RawMessage(`{"s":"\ud800"}`)),
		"data not UTF-8":              write(agg("1"), 0, json.RawMessage("{\"s\":\"\xff\"}")),
		"id holds NUL":                write(agg("1\x00"), 0, doc(1)),
		"type not UTF-8":              write(record.Key{Kind: record.KindAggregate, Type: "\xff", ID: "1"}, 0, doc(1)),
	} {
		require.ErrorIs(t, h.Store.Commit(ctx, []record.Write{w}), record.ErrInvalid, name)
	}
	requireRecord(t, load(t, h.Store, agg("1")), 0, nil)
	_, err := h.Store.Load(ctx, record.Key{Kind: record.KindAggregate, Type: "order"})
	require.ErrorIs(t, err, record.ErrInvalid)
}

func testCancelledContext(t *testing.T, h Harness) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorIs(t, h.Store.Commit(ctx, []record.Write{write(agg("1"), 0, doc(1))}), context.Canceled)
	requireRecord(t, load(t, h.Store, agg("1")), 0, nil)
}

// raceRounds repeats each race: a missing lock shows only when goroutines
// interleave inside the store's check-then-write window, which one round
// rarely hits on a fast store.
const raceRounds = 100

func testConcurrentWritersOneWins(t *testing.T, h Harness) {
	for _, n := range []int{2, 8, 32} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			for round := range raceRounds {
				raceOnce(t, h, fmt.Sprintf("%dx%d", n, round), n)
			}
		})
	}
}

// raceOnce lets n writers commit to one record from one base version at
// once.
func raceOnce(t *testing.T, h Harness, name string, n int) {
	ctx := t.Context()
	k, other := agg("race-"+name), agg("other-"+name)
	commit(t, h.Store, write(k, 0, doc(-1)), write(k, 1, doc(-2)), write(k, 2, doc(-3)))
	const base = 3

	start := make(chan struct{})
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			// Each batch also writes a second key, so a loser must not leave
			// half its batch behind.
			errs[i] = h.Store.Commit(ctx, []record.Write{
				write(other, 0, doc(i)),
				write(k, base, doc(i)),
			})
		})
	}
	close(start)
	wg.Wait()

	winner := -1
	for i, err := range errs {
		if err == nil {
			require.Equal(t, -1, winner, "%s: writers %d and %d both won", name, winner, i)
			winner = i
			continue
		}
		// A loser fails on whichever of its keys it checks first.
		require.ErrorIs(t, err, record.ErrExpectedVersion)
		var ve *record.VersionError
		require.ErrorAs(t, err, &ve)
		require.Contains(t, []record.VersionError{
			{Key: other, Expected: 0, Actual: 1},
			{Key: k, Expected: base, Actual: base + 1},
		}, *ve)
	}
	require.NotEqual(t, -1, winner, "%s: no writer won", name)
	requireRecord(t, load(t, h.Store, k), base+1, doc(winner))
	requireRecord(t, load(t, h.Store, other), 1, doc(winner))
}

func testNoLostUpdate(t *testing.T, h Harness) {
	ctx := t.Context()
	const writers, each = 32, 20
	k := record.Key{Kind: record.KindProjection, Type: "counter", ID: "1"}
	commit(t, h.Store, write(k, 0, json.RawMessage(`{"count": 0}`)))

	start := make(chan struct{})
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			<-start
			for done := 0; done < each; {
				r, err := h.Store.Load(ctx, k)
				if err != nil {
					errs[w] = err
					return
				}
				var c struct{ Count int }
				if err := json.Unmarshal(r.Data, &c); err != nil {
					errs[w] = err
					return
				}
				next := json.RawMessage(fmt.Sprintf(`{"count": %d}`, c.Count+1))
				err = h.Store.Commit(ctx, []record.Write{write(k, r.Version, next)})
				if errors.Is(err, record.ErrExpectedVersion) {
					continue
				}
				if err != nil {
					errs[w] = err
					return
				}
				done++
			}
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	requireRecord(t, load(t, h.Store, k), 1+writers*each, json.RawMessage(fmt.Sprintf(`{"count": %d}`, writers*each)))
}

func testConcurrentDisjointKeys(t *testing.T, h Harness) {
	ctx := t.Context()
	const writers, each = 32, 10
	start := make(chan struct{})
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			<-start
			k := agg("w-" + strconv.Itoa(w))
			for v := range each {
				// Writers of different records never conflict: a commit
				// merges its own records and leaves the others alone.
				if err := h.Store.Commit(ctx, []record.Write{write(k, int64(v), doc(v))}); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	for w := range writers {
		requireRecord(t, load(t, h.Store, agg("w-"+strconv.Itoa(w))), each, doc(each-1))
	}
}

func begin(t *testing.T, h Harness) Tx {
	t.Helper()
	return suite.Begin(t, h.Begin)
}

func stage(t *testing.T, tx Tx, writes ...record.Write) {
	t.Helper()
	require.NoError(t, tx.Write(t.Context(), writes))
}

func testTxReadYourWrites(t *testing.T, h Harness) {
	ctx := t.Context()
	a, b, gone := agg("a"), agg("b"), agg("gone")
	commit(t, h.Store, write(b, 0, doc(1)), write(gone, 0, doc(1)))

	tx := begin(t, h)
	requireRecord(t, load(t, tx, a), 0, nil)
	requireRecord(t, load(t, tx, b), 1, doc(1))
	stage(t, tx, write(a, 0, doc(10)), write(gone, 1, nil))
	stage(t, tx, write(a, 1, doc(11)), write(b, 1, doc(2)))

	requireRecord(t, load(t, tx, a), 2, doc(11))
	requireRecord(t, load(t, tx, b), 2, doc(2))
	requireRecord(t, load(t, tx, gone), 2, nil)
	// Staged writes are checked against the staged versions.
	requireVersionError(t, tx.Write(ctx, []record.Write{write(a, 0, doc(12))}), a, 0, 2)

	// Nobody else sees them before commit.
	requireRecord(t, load(t, h.Store, a), 0, nil)
	requireRecord(t, load(t, h.Store, b), 1, doc(1))
	requireRecord(t, load(t, h.Store, gone), 1, doc(1))

	require.NoError(t, tx.Commit(ctx))
	requireRecord(t, load(t, h.Store, a), 2, doc(11))
	requireRecord(t, load(t, h.Store, b), 2, doc(2))
	requireRecord(t, load(t, h.Store, gone), 2, nil)
	require.NoError(t, tx.Rollback(ctx), "rollback after commit is a no-op")
	requireRecord(t, load(t, h.Store, a), 2, doc(11))
}

func testTxRollback(t *testing.T, h Harness) {
	ctx := t.Context()
	a := agg("a")
	commit(t, h.Store, write(a, 0, doc(1)))
	tx := begin(t, h)
	stage(t, tx, write(a, 1, doc(2)), write(agg("b"), 0, doc(2)))
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, tx.Rollback(ctx), "rollback twice is a no-op")
	requireRecord(t, load(t, h.Store, a), 1, doc(1))
	requireRecord(t, load(t, h.Store, agg("b")), 0, nil)

	// The store is free for the next writer.
	commit(t, h.Store, write(a, 1, doc(3)))
	requireRecord(t, load(t, h.Store, a), 2, doc(3))
}

func testTxFailedWriteStagesNothing(t *testing.T, h Harness) {
	ctx := t.Context()
	a, b := agg("a"), agg("b")
	tx := begin(t, h)
	stage(t, tx, write(a, 0, doc(1)))
	err := tx.Write(ctx, []record.Write{write(a, 1, doc(2)), write(b, 0, doc(2)), write(b, 0, doc(3))})
	requireVersionError(t, err, b, 0, 1)
	requireRecord(t, load(t, tx, a), 1, doc(1))
	requireRecord(t, load(t, tx, b), 0, nil)

	stage(t, tx, write(b, 0, doc(4)))
	require.NoError(t, tx.Commit(ctx))
	requireRecord(t, load(t, h.Store, a), 1, doc(1))
	requireRecord(t, load(t, h.Store, b), 1, doc(4))
}

func testTxDone(t *testing.T, h Harness) {
	ctx := t.Context()
	tx := begin(t, h)
	stage(t, tx, write(agg("a"), 0, doc(1)))
	require.NoError(t, tx.Commit(ctx))
	require.ErrorIs(t, tx.Write(ctx, []record.Write{write(agg("a"), 1, doc(2))}), record.ErrTxDone)

	tx = begin(t, h)
	stage(t, tx, write(agg("a"), 1, doc(2)))
	require.NoError(t, tx.Rollback(ctx))
	require.ErrorIs(t, tx.Commit(ctx), record.ErrTxDone, "commit after rollback fails")
	require.ErrorIs(t, tx.Write(ctx, []record.Write{write(agg("a"), 1, doc(2))}), record.ErrTxDone)
	requireRecord(t, load(t, h.Store, agg("a")), 1, doc(1))
}
