package redisstream

import (
	"context"

	"github.com/proteanhq/protean-host/broker"
)

// NextBatch delivers up to limit of the group's ready messages of stream
// at once (see broker.Batcher), with one script: the due heads of the
// requeued line, then new entries read with one XREADGROUP COUNT n,
// without waiting. A redelivery (Attempt > 1) comes alone. limit < 1
// counts as 1.
//
// A malformed entry ends the batch before it: the messages ahead of it
// are returned, and it and the entries after it are released (see
// Release), so the next call returns its *DecodeError. As the first entry
// it is returned as that error, as from Next, and stays in flight until
// MessageTimeout dead-letters it; the entries after it are released, so
// they follow in order.
func (b *Broker) NextBatch(ctx context.Context, stream, group string, limit int) ([]broker.Delivery, error) {
	if err := checkGroup("next batch", stream, group); err != nil {
		return nil, err
	}
	if err := b.check(ctx); err != nil {
		return nil, err
	}
	now := b.now()
	r, err := b.read(ctx, batchScript, "next batch", stream, group, now, max(limit, 1))
	if err != nil {
		return nil, err
	}
	if r.status != "batch" || len(r.rest) < 1 {
		return nil, broker.ErrEmpty
	}
	entries, _ := r.rest[0].([]any)
	out := make([]broker.Delivery, 0, len(entries))
	for i, e := range entries {
		d, err := b.delivery(stream, group, now, reply{rest: asSlice(e)})
		if err == nil {
			out = append(out, d)
			continue
		}
		rest := entries[i:]
		if i == 0 {
			rest = entries[1:] // it stays in flight, as after Next
		}
		b.releaseEntries(ctx, stream, group, rest)
		if i == 0 {
			return nil, err
		}
		break
	}
	return out, nil
}

// releaseEntries releases entries of a batch reply by entry id.
func (b *Broker) releaseEntries(ctx context.Context, stream, group string, entries []any) {
	for _, rest := range entries {
		eid, _ := asSlice(rest)[0].(string)
		if _, rerr := b.run(ctx, releaseScript, "release", stream, group, b.now(), eid, "1"); rerr != nil {
			// It stays in flight until MessageTimeout: late, not lost.
			b.log.Warn("broker: release failed", "stream", stream, "group", group, "entry", eid, "error", rerr)
		}
	}
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	if len(s) == 0 {
		return []any{""}
	}
	return s
}

// Release gives back a message delivered to the group that its consumer
// did not try (see broker.Batcher): it goes into the group's requeued line
// at its place in entry order, due at once, so it follows any earlier
// message awaiting its retry and comes before the stream's later entries,
// and its delivery count is taken back by one, so it comes back with the
// same Attempt. Releasing a message that is requeued, dead-lettered or
// discarded returns nil; an acked one broker.ErrAcked; one never delivered
// broker.ErrNotDelivered.
func (b *Broker) Release(ctx context.Context, stream, group, id string) error {
	_, err := b.settle(ctx, "release", stream, group, id, releaseScript, "0")
	return err
}
