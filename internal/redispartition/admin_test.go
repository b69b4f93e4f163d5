package redispartition_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/redisstream"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/partition"
)

var projSubs = []partition.Subscription{{Group: "proj", Categories: []string{"order"}}}

func (r *rig) admin() *redispartition.Admin {
	r.t.Helper()
	a, err := redispartition.NewAdmin(redispartition.AdminOptions{Redis: r.rdb, Prefix: r.prefix, Positions: r.store, Decode: redisstream.Decode})
	require.NoError(r.t, err)
	return a
}

// haltedRig publishes m-1..m-4 to order:bad (m-2 fails while failing is
// set) and m-5, m-6 to order:good, starts host-a and waits for order:bad to
// halt after max_retries (3) attempts at m-2.
func haltedRig(t *testing.T) (*rig, *effects, *redispartition.Consumer, *atomic.Bool) {
	r := newRig(t)
	h := newEffects(r.store)
	var failing atomic.Bool
	failing.Store(true)
	h.fail = func(m delivery.Message, _ int) error {
		if m.ID == "m-2" && failing.Load() {
			return errors.New("boom")
		}
		return nil
	}
	r.pub.publish("order", "bad", 4)
	r.pub.publish("order", "good", 2)
	// A short TTL: discovery (every TTL/5) must find the unit again once an
	// operator clears its halt.
	c := r.consumer("host-a", h, 2*time.Second)
	start(t, c)
	r.waitHalted("proj", "order:bad")
	testwait.For(t, "the good key flows", func() (bool, string) {
		got, _ := h.snapshot()
		return len(got["order:good"]) == 2, fmt.Sprint(got)
	})
	return r, h, c, &failing
}

func (r *rig) waitHalted(group, unit string) {
	r.t.Helper()
	testwait.For(r.t, unit+" halts", func() (bool, string) {
		n, err := r.rdb.Exists(context.Background(), r.prefix+redispartition.HaltKey(group, unit)).Result()
		return err == nil && n == 1, fmt.Sprintf("halt key exists: %d %v", n, err)
	})
}

func (r *rig) waitAppliedLog(h *effects, unit string, want []int64) {
	r.t.Helper()
	testwait.For(r.t, unit+" applied "+fmt.Sprint(want), func() (bool, string) {
		got, _ := h.snapshot()
		return fmt.Sprint(got[unit]) == fmt.Sprint(want), fmt.Sprint(got[unit])
	})
}

func (r *rig) audit() []redis.XMessage {
	r.t.Helper()
	es, err := r.rdb.XRange(context.Background(), r.prefix+redispartition.AuditStream, "-", "+").Result()
	require.NoError(r.t, err)
	return es
}

func (h *effects) callsOf(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls[id]
}

func statusOf(t *testing.T, sts []redispartition.Status, group, unit string) redispartition.Status {
	t.Helper()
	for _, s := range sts {
		if s.Group == group && s.Unit == unit {
			return s
		}
	}
	require.Failf(t, "unit not listed", "%s %s in %+v", group, unit, sts)
	return redispartition.Status{}
}

func TestAdminListsHaltedAndOwnedUnits(t *testing.T) {
	t.Parallel()
	r, _, _, _ := haltedRig(t)
	ctx := context.Background()
	sts, err := r.admin().List(ctx, projSubs)
	require.NoError(t, err)
	require.Len(t, sts, 2)

	bad := statusOf(t, sts, "proj", "order:bad")
	require.Equal(t, "halted", bad.State())
	require.Equal(t, "order", bad.Category)
	require.Equal(t, "bad", bad.Key)
	require.Empty(t, bad.Owner, "the halt released the lease")
	require.Equal(t, int64(3), bad.Pending, "m-2 and the two read after it stay pending")
	require.Equal(t, int64(0), bad.Lag)
	require.Equal(t, "m-2", bad.Halt.MessageID)
	require.Equal(t, 3, bad.Halt.Attempts)
	require.Contains(t, bad.Halt.Reason, "boom")
	require.Equal(t, map[string]int64{"order:bad": 1}, bad.Positions)
	require.True(t, bad.Indexed)

	good := statusOf(t, sts, "proj", "order:good")
	require.Equal(t, "owned", good.State())
	require.Equal(t, "host-a", good.Owner)
	require.Equal(t, int64(1), good.Generation)
	require.Equal(t, int64(0), good.Pending)
	require.Nil(t, good.Halt)
	require.Equal(t, map[string]int64{"order:good": 6}, good.Positions)

	// A halted unit whose key left the index, of a group no subscription
	// names, still shows (found by its halt record).
	require.NoError(t, r.rdb.SRem(ctx, r.prefix+redispartition.IndexKey("order"), "bad").Err())
	sts, err = r.admin().List(ctx, nil)
	require.NoError(t, err)
	require.Len(t, sts, 1)
	require.Equal(t, "halted", sts[0].State())
	require.Equal(t, "order:bad", sts[0].Unit)
	require.False(t, sts[0].Indexed)
	require.Equal(t, int64(3), sts[0].Pending)
}

func TestAdminListCountsPendingAndLag(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	r.pub.publish("order", "c-1", 5)
	r.pub.publish("payment", "o-1", 2)
	r.pub.publish("shipping", "o-1", 1)
	l, err := r.leases.Acquire(ctx, "proj", "order:c-1", "host-x:7")
	require.NoError(t, err)
	es, err := r.leases.Read(ctx, l, "order:c-1", false, 2)
	require.NoError(t, err)
	require.Len(t, es, 2)
	require.NoError(t, r.store.Set(ctx, "proj", "order:c-1", "order:c-1", 1))

	subs := append([]partition.Subscription{{Group: "pm", Categories: []string{"payment", "shipping"}, Correlated: true}}, projSubs...)
	sts, err := r.admin().List(ctx, subs)
	require.NoError(t, err)
	require.Len(t, sts, 2)
	c1 := statusOf(t, sts, "proj", "order:c-1")
	require.Equal(t, "owned", c1.State())
	require.Equal(t, "host-x:7", c1.Owner, "an owner with a colon in it")
	require.Equal(t, l.Generation, c1.Generation)
	require.Equal(t, int64(2), c1.Pending)
	require.Equal(t, int64(3), c1.Lag)
	require.Equal(t, map[string]int64{"order:c-1": 1}, c1.Positions)

	pm := statusOf(t, sts, "pm", "pm:o-1")
	require.Equal(t, "idle", pm.State())
	require.Equal(t, "pm", pm.Category, "a correlated unit is listed under its process manager")
	require.Equal(t, "o-1", pm.Key)
	require.Equal(t, []string{"payment:o-1", "shipping:o-1"}, pm.Sources)
	require.Equal(t, int64(3), pm.Lag, "a group not created yet has every entry of every source to come")
	require.Equal(t, int64(0), pm.Pending)
}

func TestAdminInspectShowsPendingHeadFirst(t *testing.T) {
	t.Parallel()
	r, _, _, _ := haltedRig(t)
	r.pub.publish("order", "bad", 1) // m-7, not delivered: the unit is halted
	d, err := r.admin().Inspect(context.Background(), projSubs[0], "order:bad")
	require.NoError(t, err)
	require.Equal(t, "halted", d.State())
	require.NotNil(t, d.Halt)
	var ids []string
	for _, e := range d.Entries {
		ids = append(ids, fmt.Sprintf("%s pending=%v halted=%v gp=%d", e.MessageID, e.Pending, e.Halted, e.GlobalPosition))
		require.Equal(t, "Happened", e.Type)
		require.JSONEq(t, `{"k":"bad"}`, e.Data)
		require.Empty(t, e.Problem)
	}
	require.Equal(t, []string{
		"m-2 pending=true halted=true gp=2",
		"m-3 pending=true halted=false gp=3",
		"m-4 pending=true halted=false gp=4",
		"m-7 pending=false halted=false gp=7",
	}, ids)
	require.Equal(t, d.Halt.Entry, d.Entries[0].ID)
	require.Equal(t, int64(3), d.Entries[0].Failures, "three failed attempts")
	require.Equal(t, int64(0), d.Entries[1].Failures)
}

func TestAdminSkipAcksTheHeadAndFlowResumes(t *testing.T) {
	t.Parallel()
	r, h, _, _ := haltedRig(t)
	ctx := context.Background()
	adm := r.admin()
	halt := r.rdb.HGetAll(ctx, r.prefix+redispartition.HaltKey("proj", "order:bad")).Val()

	out, err := adm.Skip(ctx, "proj", "order:bad", redispartition.Operator{By: "ops", Reason: "bad data"})
	require.NoError(t, err)
	require.True(t, out.Acked)
	require.Equal(t, "m-2", out.Halt.MessageID)
	require.Equal(t, halt["entry"], out.Halt.Entry)

	audit := r.audit()
	require.Len(t, audit, 1)
	require.Equal(t, out.AuditEntry, audit[0].ID)
	for k, v := range map[string]string{"action": "skip", "group": "proj", "unit": "order:bad", "stream": "order:bad",
		"entry": halt["entry"], "message_id": "m-2", "by": "ops", "reason": "bad data", "attempts": "3"} {
		require.Equal(t, v, audit[0].Values[k], k)
	}
	require.NotEmpty(t, audit[0].Values["at"])
	// The key is announced on the category's wake-up stream, as a
	// handover announces released keys: a host with room acquires it at
	// once, not at its discovery's walk over the key.
	require.True(t, out.Woken)
	last, err := r.rdb.XRevRangeN(ctx, r.prefix+redispartition.WakeKey("order"), "+", "-", 1).Result()
	require.NoError(t, err)
	require.Len(t, last, 1)
	require.Contains(t, last[0].Values, "bad", "the skipped unit's key is announced")

	// The live host acquires the unit again; the entries after
	// the skipped one flow, and the skipped one is never handled again.
	r.waitAppliedLog(h, "order:bad", []int64{1, 3, 4})
	r.pub.publish("order", "bad", 1)
	r.waitAppliedLog(h, "order:bad", []int64{1, 3, 4, 7})
	require.Equal(t, 3, h.callsOf("m-2"))
	n, err := r.rdb.HLen(ctx, r.prefix+redispartition.AttemptsKey("proj", "order:bad")).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the skipped entry's attempts are cleared")
	got, _ := h.snapshot()
	require.Equal(t, []int64{5, 6}, got["order:good"])

	// Skipping again is refused, naming the state.
	testwait.For(t, "order:bad owned again", func() (bool, string) {
		v, _ := r.rdb.Get(ctx, r.prefix+redispartition.LeaseKey("proj", "order:bad")).Result()
		return v == "host-a:2", v
	})
	_, err = adm.Skip(ctx, "proj", "order:bad", redispartition.Operator{})
	require.ErrorIs(t, err, redispartition.ErrNotHalted)
	var se *redispartition.StateError
	require.ErrorAs(t, err, &se)
	require.Equal(t, "owned by host-a at generation 2", se.State)
	_, err = adm.Resume(ctx, "proj", "order:nobody", redispartition.Operator{})
	require.ErrorAs(t, err, &se)
	require.Equal(t, "not halted", se.State)
	require.Len(t, r.audit(), 1, "a refused action is not audited")
}

func TestAdminDLQMovesTheHeadAndFlowResumes(t *testing.T) {
	t.Parallel()
	r, h, _, _ := haltedRig(t)
	ctx := context.Background()
	halt := r.rdb.HGetAll(ctx, r.prefix+redispartition.HaltKey("proj", "order:bad")).Val()

	out, err := r.admin().DLQ(ctx, "proj", "order:bad", redispartition.Operator{By: "ops", Reason: "park it"})
	require.NoError(t, err)
	require.True(t, out.Acked)
	require.Equal(t, "order:bad:dlq", out.DLQStream)
	require.Equal(t, partition.DLQStreamName("order", "bad"), out.DLQStream)

	dl, err := r.rdb.XRange(ctx, r.prefix+out.DLQStream, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, dl, 1)
	require.Equal(t, out.DLQEntry, dl[0].ID)
	m, err := redisstream.Decode(dl[0].ID, dl[0].Values)
	require.NoError(t, err, "the dead letter keeps the message's fields")
	require.Equal(t, "m-2", m.ID)
	require.Equal(t, int64(2), m.GlobalPosition)
	require.JSONEq(t, `{"k":"bad"}`, string(m.Data))
	for k, v := range map[string]string{"dl_group": "proj", "dl_attempts": "3", "dl_entry": halt["entry"], "dl_stream": "order:bad", "dl_unit": "order:bad"} {
		require.Equal(t, v, dl[0].Values[k], k)
	}
	require.Contains(t, dl[0].Values["dl_reason"], "boom")

	// The broker's own DLQ listing reads a partition's dead letters.
	b, err := redisstream.New(r.rdb, redisstream.Options{Options: broker.DefaultOptions(), Prefix: r.prefix, Consumer: "ops"})
	require.NoError(t, err)
	dls, err := b.DLQ(ctx, "order:bad", "proj")
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Equal(t, "m-2", dls[0].ID)
	require.Equal(t, 3, dls[0].Attempts)
	require.False(t, dls[0].FailedAt.IsZero())

	audit := r.audit()
	require.Len(t, audit, 1)
	require.Equal(t, "dlq", audit[0].Values["action"])
	require.Equal(t, out.DLQEntry, audit[0].Values["dlq_entry"])

	r.waitAppliedLog(h, "order:bad", []int64{1, 3, 4})
	require.Equal(t, 3, h.callsOf("m-2"))
}

func TestAdminDLQRefusesWhenTheHeadIsGone(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	ctx := context.Background()
	r.pub.publish("order", "c-1", 2)
	l, err := r.leases.Acquire(ctx, "proj", "order:c-1", "host-x")
	require.NoError(t, err)
	es, err := r.leases.Read(ctx, l, "order:c-1", false, 1)
	require.NoError(t, err)
	require.NoError(t, r.leases.Halt(ctx, l, redispartition.Halt{Stream: "order:c-1", Entry: es[0].ID, MessageID: "m-1", Reason: "boom", Attempts: 3, HaltedAt: time.Now()}))
	require.NoError(t, r.rdb.XDel(ctx, r.prefix+"order:c-1", es[0].ID).Err())

	_, err = r.admin().DLQ(ctx, "proj", "order:c-1", redispartition.Operator{})
	require.ErrorIs(t, err, redispartition.ErrEntryGone)
	n, err := r.rdb.Exists(ctx, r.prefix+redispartition.HaltKey("proj", "order:c-1")).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the halt stays")
	p, err := r.rdb.XPending(ctx, r.prefix+"order:c-1", "proj").Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), p.Count, "nothing acked")
	require.Empty(t, r.audit())
	n, err = r.rdb.Exists(ctx, r.prefix+"order:c-1:dlq").Result()
	require.NoError(t, err)
	require.Zero(t, n)
	// Skip still gets the unit going.
	out, err := r.admin().Skip(ctx, "proj", "order:c-1", redispartition.Operator{})
	require.NoError(t, err)
	require.True(t, out.Acked)
}

func TestAdminResumeRetriesAfresh(t *testing.T) {
	t.Parallel()
	r, h, _, failing := haltedRig(t)
	ctx := context.Background()
	adm := r.admin()
	require.Equal(t, 3, h.callsOf("m-2"))

	// Still failing: max_retries fresh attempts, then the unit halts again.
	_, err := adm.Resume(ctx, "proj", "order:bad", redispartition.Operator{By: "ops"})
	require.NoError(t, err)
	testwait.For(t, "three fresh attempts at m-2", func() (bool, string) {
		return h.callsOf("m-2") == 6, fmt.Sprint(h.callsOf("m-2"))
	})
	r.waitHalted("proj", "order:bad")
	halt := r.rdb.HGetAll(ctx, r.prefix+redispartition.HaltKey("proj", "order:bad")).Val()
	require.Equal(t, "3", halt["attempts"], "attempts were reset by the resume")
	require.Equal(t, "2", halt["generation"])

	// Fixed: the head is handled and everything after it flows.
	failing.Store(false)
	out, err := adm.Resume(ctx, "proj", "order:bad", redispartition.Operator{By: "ops", Reason: "fixed"})
	require.NoError(t, err)
	require.False(t, out.Acked, "resume acks nothing")
	r.waitAppliedLog(h, "order:bad", []int64{1, 2, 3, 4})
	require.Equal(t, 7, h.callsOf("m-2"))
	audit := r.audit()
	require.Len(t, audit, 2)
	require.Equal(t, "resume", audit[1].Values["action"])
	require.Equal(t, "fixed", audit[1].Values["reason"])
}

// A Protean category holds "::": Inspect names the unit by its last colon
// (keys hold none), from the unit or from one of its lane streams, and
// refuses a name that is no unit.
func TestAdminInspectProteanCategory(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.pub.publish("test::order", "c-1", 2)
	sub := partition.Subscription{Group: "proj", Categories: []string{"test::order"}}
	ctx := context.Background()
	for _, name := range []string{"test::order:c-1", "test::order:c-1:backfill"} {
		d, err := r.admin().Inspect(ctx, sub, name)
		require.NoError(t, err, name)
		require.Equal(t, "test::order", d.Category, name)
		require.Equal(t, "c-1", d.Key, name)
		require.Equal(t, "test::order:c-1", d.Unit, name)
		require.Equal(t, []string{"test::order:c-1"}, d.Sources, name)
		require.True(t, d.Indexed, name)
		require.Len(t, d.Entries, 2, name)
	}
	for _, name := range []string{"test::order:", "test", ""} {
		_, err := r.admin().Inspect(ctx, sub, name)
		require.ErrorIs(t, err, partition.ErrInvalidUnit, name)
	}
}
