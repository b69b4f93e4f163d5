package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/position"
)

// opBatch is a run of Op messages of the behave module, at global
// positions from 1.
func opBatch(gen int64, ops ...string) delivery.Batch {
	b := delivery.Batch{Group: "behave", Unit: "ops:u", Source: "ops:u", Generation: gen}
	for i, op := range ops {
		// "read" reads stream ops-none and emits an event to ops-{i+1}.
		data, _ := json.Marshal(map[string]string{"op": op, "id": fmt.Sprint(i + 1), "arg": "ops-none"})
		b.Messages = append(b.Messages, delivery.Message{ID: fmt.Sprintf("m-%d", i+1), Type: "Op", EventStream: "ops-d",
			Data: data, GlobalPosition: int64(i + 1), Position: int64(i)})
	}
	return b
}

// partitionEngine is newEngine with the positions the partition handler
// fences against.
func partitionEngine(t *testing.T) (*Engine, *unitofwork.Memory) {
	t.Helper()
	e, _ := newEngine(t)
	mem := unitofwork.NewMemory()
	e.opts.Records = mem.Records
	e.opts.Events = mem.Events
	e.opts.UnitOfWork = unitofwork.New(mem, unitofwork.Options{Broker: "default"})
	return e, mem
}

// seen lists which messages' effects are committed: "read" emits an
// event to stream ops-{n} for message n.
func seen(t *testing.T, mem *unitofwork.Memory) []string {
	t.Helper()
	var out []string
	for n := 1; n <= 5; n++ {
		evs, err := mem.Events.ReadStream(context.Background(), fmt.Sprintf("ops-%d", n), 0, 0)
		require.NoError(t, err)
		if len(evs) > 0 {
			out = append(out, fmt.Sprint(n))
		}
	}
	return out
}

// A run is one guest call; a failure at message k commits the effects of
// the messages before k, with the position past them, and reports k's
// error, retryable or not as the guest said.
func TestPartitionBatchCommitsThePrefixBeforeAFailure(t *testing.T) {
	e, mem := partitionEngine(t)
	ctx := context.Background()
	row, err := mem.Positions.Claim(ctx, "behave", "ops:u")
	require.NoError(t, err)
	h := e.Handler()

	done, err := h.Handle(ctx, opBatch(row.Generation, "read", "read", "transient", "read"))
	require.Equal(t, 2, done)
	var he *HandlerError
	require.ErrorAs(t, err, &he)
	require.True(t, he.Retryable(), "a transient failure is retried")
	require.Equal(t, []string{"1", "2"}, seen(t, mem))
	got, _, err := mem.Positions.Get(ctx, "behave", "ops:u")
	require.NoError(t, err)
	require.Equal(t, int64(2), got.Positions["ops:u"])

	// The rest of the run, from the failed message on, now succeeds; a
	// message the handler does not handle only moves the position.
	b := opBatch(row.Generation, "read", "read", "read", "read")
	b.Messages = b.Messages[2:]
	b.Messages = append(b.Messages, delivery.Message{ID: "m-5", Type: "Unrelated", GlobalPosition: 5})
	done, err = h.Handle(ctx, b)
	require.NoError(t, err)
	require.Equal(t, 3, done)
	require.Equal(t, []string{"1", "2", "3", "4"}, seen(t, mem))
	got, _, err = mem.Positions.Get(ctx, "behave", "ops:u")
	require.NoError(t, err)
	require.Equal(t, int64(5), got.Positions["ops:u"])

	_, err = h.Handle(ctx, opBatch(row.Generation, "rejected"))
	require.ErrorAs(t, err, &he)
	require.False(t, he.Retryable(), "a rejection halts the partition at once")
}

// A stale owner's run commits nothing: the fence rejects it whole.
func TestPartitionBatchOfAStaleOwnerCommitsNothing(t *testing.T) {
	e, mem := partitionEngine(t)
	ctx := context.Background()
	old, err := mem.Positions.Claim(ctx, "behave", "ops:u")
	require.NoError(t, err)
	_, err = mem.Positions.Claim(ctx, "behave", "ops:u") // a newer owner
	require.NoError(t, err)
	done, err := e.Handler().Handle(ctx, opBatch(old.Generation, "read", "read"))
	require.Equal(t, 0, done)
	require.ErrorIs(t, err, position.ErrFenced)
	require.Empty(t, seen(t, mem))
}

type opKeys struct{}

func (opKeys) PartitionField(category string) (string, bool) { return "arg", category == "ops" }

// Group commit keeps each message atomic: when the commit of message 3 of
// a run fails (its event's partition key is rejected: "read" of a stream
// of ten events emits arg ":"), messages 1 and 2 commit with the position
// past them, and 3 is the failure, a permanent one; before group commit
// the whole run rolled back.
func TestPartitionRunCommitsThePrefixBeforeACommitFailure(t *testing.T) {
	e, mem := partitionEngine(t)
	e.opts.UnitOfWork = unitofwork.New(mem, unitofwork.Options{Broker: "default", Keys: opKeys{}})
	ctx := context.Background()
	row, err := mem.Positions.Claim(ctx, "behave", "ops:u")
	require.NoError(t, err)
	for range 10 {
		_, err = mem.Events.Append(ctx, []eventstore.NewEvent{{Stream: "ops-ten", Type: "Other", Data: json.RawMessage(`{}`), ExpectedVersion: eventstore.AnyVersion}})
		require.NoError(t, err)
	}
	b := opBatch(row.Generation, "read", "read", "read", "read")
	b.Messages[2].Data = json.RawMessage(`{"op":"read","id":"3","arg":"ops-ten"}`)

	done, err := e.Handler().Handle(ctx, b)
	var ke *unitofwork.KeyError
	require.ErrorAs(t, err, &ke)
	var he *HandlerError
	require.ErrorAs(t, err, &he)
	require.False(t, he.Retryable(), "a rejected key is a poison message")
	require.Equal(t, 2, done)
	require.Equal(t, []string{"1", "2"}, seen(t, mem))
	got, _, err := mem.Positions.Get(ctx, "behave", "ops:u")
	require.NoError(t, err)
	require.Equal(t, int64(2), got.Positions["ops:u"])
}
