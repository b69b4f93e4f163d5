package record_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/proteanhq/protean-host/internal/pipeline"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/record"
)

// queue commits writes through QueueWrite in one pipelined transaction,
// as the unit of work does, and returns the reader's error (the
// transaction rolled back when it is not nil).
func queue(t *testing.T, pool *pgxpool.Pool, writes ...record.Write) error {
	t.Helper()
	return testserver.Pipelined(t, pool, func(b *pgx.Batch) (func(pgx.BatchResults) error, error) {
		return record.QueueWrite(b, writes)
	})
}

func doc(v string) json.RawMessage { return json.RawMessage(fmt.Sprintf(`{"v":%q}`, v)) }

func key(id string) record.Key { return record.Key{Kind: "projection", Type: "t", ID: id} }

func write(id string, expected int64, v string) record.Write {
	w := record.Write{Key: key(id), ExpectedVersion: expected}
	if v != "" {
		w.Data = doc(v)
	}
	return w
}

// TestQueueWriteSeveral pins the one statement QueueWrite sends for several
// first writes or several updates: each record moves as the statements
// one by one would move it, and the whole is refused, changing nothing,
// exactly when one of them would be.
func TestQueueWriteSeveral(t *testing.T) {
	t.Parallel()
	pool := testserver.PostgresPool(t)
	s := record.NewPostgres(pool)
	want := func(id string, version int64, data string) {
		t.Helper()
		r, err := s.Load(context.Background(), key(id))
		if err != nil {
			t.Fatal(err)
		}
		if r.Version != version || string(r.Data) != data {
			t.Fatalf("%s: version %d data %s, want %d %s", id, r.Version, r.Data, version, data)
		}
	}
	refused := func(err error) {
		t.Helper()
		if !errors.Is(err, pipeline.ErrRefused) {
			t.Fatalf("got %v, want a refusal", err)
		}
	}
	// First writes, in one statement.
	if err := queue(t, pool, write("a", 0, "a1"), write("b", 0, "b1"), write("c", 0, "c1")); err != nil {
		t.Fatal(err)
	}
	want("a", 1, `{"v":"a1"}`)
	want("c", 1, `{"v":"c1"}`)
	// Updates, in one statement; a's two writes chain into one, a null
	// document clears b's data.
	if err := queue(t, pool, write("a", 1, "a2"), write("a", 2, "a3"), write("b", 1, ""), write("c", 1, "c2")); err != nil {
		t.Fatal(err)
	}
	want("a", 3, `{"v":"a3"}`)
	want("b", 2, ``)
	want("c", 2, `{"v":"c2"}`)
	// One stale version among updates refuses all of them.
	refused(queue(t, pool, write("a", 3, "x"), write("b", 1, "x"), write("c", 2, "x")))
	want("a", 3, `{"v":"a3"}`)
	want("c", 2, `{"v":"c2"}`)
	// A second chain of one record expects a version its first does not
	// leave: refused, as the second statement one by one would be.
	refused(queue(t, pool, write("a", 3, "x"), write("a", 7, "y"), write("c", 2, "x")))
	want("a", 3, `{"v":"a3"}`)
	// A first write of a record that exists, among first writes.
	refused(queue(t, pool, write("d", 0, "d1"), write("b", 0, "x"), write("e", 0, "e1")))
	want("d", 0, ``)
	want("b", 2, ``)
	// First writes and updates together go one statement each, and are
	// refused as before.
	if err := queue(t, pool, write("a", 3, "a4"), write("d", 0, "d1")); err != nil {
		t.Fatal(err)
	}
	want("a", 4, `{"v":"a4"}`)
	want("d", 1, `{"v":"d1"}`)
	refused(queue(t, pool, write("a", 4, "x"), write("e", 0, "e1"), write("f", 1, "x")))
	want("a", 4, `{"v":"a4"}`)
	want("e", 0, ``)
}
