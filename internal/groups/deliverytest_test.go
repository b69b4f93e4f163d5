package groups_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/delivery/deliverytest"
	"github.com/proteanhq/protean-host/internal/groups"
	"github.com/proteanhq/protean-host/internal/redisstream"
	"github.com/proteanhq/protean-host/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// dtBroker is what the harness needs of a broker: the groups' source, a
// publisher, and its dead letters.
type dtBroker interface {
	groups.Source
	broker.Publisher
	broker.DeadLetterer
	Close() error
}

// The broker consumer groups pass the delivery sources' conformance
// suite on both brokers: unkeyed (one consumer group reads a stream in
// publish order), and a message past its retries is dead-lettered by the
// broker while the group goes on.
func TestDeliverytest(t *testing.T) {
	t.Parallel()
	for name, newBroker := range map[string]func(t *testing.T, o broker.Options) dtBroker{
		"Inline": func(t *testing.T, o broker.Options) dtBroker {
			b, err := broker.NewInline(o)
			require.NoError(t, err)
			return b
		},
		"Redis": func(t *testing.T, o broker.Options) dtBroker {
			url, prefix := testserver.Redis(t)
			ro, err := redis.ParseURL(url)
			require.NoError(t, err)
			c := redis.NewClient(ro)
			t.Cleanup(func() { _ = c.Close() })
			b, err := redisstream.New(c, redisstream.Options{Options: o, Prefix: prefix})
			require.NoError(t, err)
			return b
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			deliverytest.Run(t, deliverytest.Features{DeadLetter: true}, func(t *testing.T) deliverytest.Harness {
				b := newBroker(t, broker.Options{Policy: deliverytest.Policy(), MessageTimeout: time.Minute, EnableDLQ: true})
				t.Cleanup(func() { _ = b.Close() })
				return &dtHarness{b: b}
			})
		})
	}
}

// dtHarness is the group "g" reading the stream "order" of one broker.
type dtHarness struct {
	b dtBroker
	n atomic.Int64
}

const dtGroup, dtStream = "g", "order"

func (h *dtHarness) Publish(ctx context.Context, msgs ...deliverytest.Message) ([]string, error) {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = "m-" + strconv.FormatInt(h.n.Add(1), 10)
		if err := h.b.Publish(ctx, delivery.Message{ID: ids[i], Stream: dtStream, Category: dtStream, Type: m.Type, Data: m.Data}); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

func (h *dtHarness) Start(ctx context.Context, c deliverytest.Config) (func(context.Context) error, error) {
	g := groups.New(groups.Options{Source: h.b, Handler: c.Handler, Classify: c.Classify, Retry: c.Policy,
		Groups: func() []groups.Group { return []groups.Group{{Handler: dtGroup, Stream: dtStream}} }})
	if err := g.Start(ctx); err != nil {
		return nil, err
	}
	return g.Stop, nil
}

// Commit has nothing to commit: a group's record of what it applied is the
// broker's ack, which the groups send once the handler returns.
func (h *dtHarness) Commit(context.Context, delivery.Batch, int) error { return nil }

// GivenUp returns the group's dead letters.
func (h *dtHarness) GivenUp(ctx context.Context) ([]string, error) {
	dl, err := h.b.DLQ(ctx, dtStream, dtGroup)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(dl))
	for i, d := range dl {
		out[i] = d.ID
	}
	return out, nil
}
