package memtx_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/memtx"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/txdone"
)

var errDone = txdone.Err

func TestLife(t *testing.T) {
	var write sync.Mutex
	l := memtx.Begin(&write)
	require.False(t, write.TryLock(), "Begin holds the store's write lock")
	require.True(t, l.Enter())
	l.Leave()

	applied := 0
	require.NoError(t, l.Commit(func() { applied++ }))
	require.True(t, write.TryLock(), "Commit released the write lock")
	write.Unlock()
	require.NoError(t, l.Commit(func() { applied++ }), "a second Commit is a no-op")
	require.Equal(t, 1, applied)
	require.False(t, l.Enter(), "operations fail after the end")
	require.ErrorIs(t, l.Done(), errDone)
	l.Rollback(func() { t.Fatal("Rollback after Commit must not discard") })

	l = memtx.Begin(&write)
	discarded := false
	l.Rollback(func() { discarded = true })
	require.True(t, discarded)
	require.True(t, write.TryLock(), "Rollback released the write lock")
	write.Unlock()
	require.ErrorIs(t, l.Commit(func() { t.Fatal("Commit after Rollback must not apply") }), errDone)
	l.Rollback(func() { t.Fatal("a second Rollback must not discard") })
}

// A transaction waiting to begin gets the store once the open one ends
// (that it cannot begin before is TestLife's TryLock check).
func TestBeginAfterTheOpenTransactionEnds(t *testing.T) {
	var write sync.Mutex
	first := memtx.Begin(&write)
	second := make(chan *memtx.Life)
	go func() { second <- memtx.Begin(&write) }()
	first.Rollback(func() {})
	l := testwait.Recv(t, "the second transaction to begin", second)
	require.NoError(t, l.Commit(func() {}))
}
