package redispartition_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/redispartition"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/testwait"
	"github.com/proteanhq/protean-host/internal/unitofwork"
)

// pgEffects is a native handler whose effects are real: for each message it
// appends an event "Applied" to stream log-{key} through the unit of work
// on PostgreSQL, fenced by the unit's generation and position, as the
// engine commits a guest's effects.
type pgEffects struct {
	uow  *unitofwork.UnitOfWork
	gate func(ctx context.Context)
}

func (h *pgEffects) Handle(ctx context.Context, b delivery.Batch) (int, error) {
	if h.gate != nil {
		h.gate(ctx)
	}
	var changes []unitofwork.Change
	for _, m := range b.Messages {
		_, key, _ := strings.Cut(b.Unit, ":")
		data, _ := json.Marshal(map[string]int64{"gp": m.GlobalPosition})
		changes = append(changes, unitofwork.Change{Effects: &abi.Effects{Events: []abi.NewEvent{{Stream: "log-" + key, Type: "Applied", Data: data}}}})
	}
	fence := partitionFence(b)
	if _, err := h.uow.CommitFenced(ctx, fence, changes...); err != nil {
		return 0, err
	}
	return len(b.Messages), nil
}

// The stall test on real PostgreSQL: the stale owner's late commit is
// rejected by the positions fence in the effect transaction, so its events
// never land; the log holds each message once, in publish order.
func TestStalledOwnersLateCommitIsRejectedByPostgres(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	pg := unitofwork.NewPostgres(testserver.PostgresPool(t))
	uow := unitofwork.New(pg, unitofwork.Options{Broker: "default"})
	stall, stalled, release := stallGate(t)
	ha := &pgEffects{uow: uow, gate: stall}
	hb := &pgEffects{uow: uow}
	r.pub.publish("order", "c-1", 4)
	cons := func(owner string, h delivery.Handler) *redispartition.Consumer {
		return r.consumer(owner, h, 300*time.Millisecond, func(o *redispartition.ConsumerOptions) { o.Positions = pg.Positions })
	}
	a := cons("host-a", ha)
	start(t, a)
	testwait.Recv(t, "host-a stalls inside its first batch", stalled)
	require.NoError(t, r.rdb.Del(context.Background(), r.prefix+redispartition.LeaseKey("proj", "order:c-1")).Err())
	b := cons("host-b", hb)
	start(t, b)
	logged := func() []int64 {
		evs, err := pg.Events.ReadStream(context.Background(), "log-c-1", 0, 0)
		require.NoError(t, err)
		var out []int64
		for _, ev := range evs {
			var d struct{ GP int64 }
			require.NoError(t, json.Unmarshal(ev.Data, &d))
			out = append(out, d.GP)
		}
		return out
	}
	testwait.For(t, "host-b applies the four messages", func() (bool, string) {
		got := logged()
		return len(got) == 4, fmt.Sprint(got)
	})
	release()
	testwait.For(t, "host-a gives the partition up", func() (bool, string) {
		return len(a.Owned()) == 0, fmt.Sprint(a.Owned())
	})
	r.pub.publish("order", "c-1", 2)
	testwait.For(t, "host-b applies the next two", func() (bool, string) {
		got := logged()
		return len(got) == 6, fmt.Sprint(got)
	})
	require.Equal(t, []int64{1, 2, 3, 4, 5, 6}, logged(), "each message once, in publish order: the stale commit was rejected")
}
