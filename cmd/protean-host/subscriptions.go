package main

import (
	"context"
	"encoding/json"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/clock"
	"github.com/proteanhq/protean-host/delivery"
	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/engine"
	"github.com/proteanhq/protean-host/internal/subscription"
	"github.com/proteanhq/protean-host/internal/unitofwork"
	"github.com/proteanhq/protean-host/partition"
	"github.com/proteanhq/protean-host/position"
)

// newSubscriptions builds the event-store subscriptions' consumer: the
// engine's batch handler, the positions fence, the leases and failure
// records of the stores, the partition keys of the running set.
func newSubscriptions(cfg config.Config, st *stores, handler delivery.Handler, subs func() []subscription.Subscription, uow *unitofwork.UnitOfWork, owner string,
	reg prometheus.Registerer, infra *delivery.Metrics, log *slog.Logger, clk clock.Clock) (*subscription.Consumer, error) {
	p, es, ss := cfg.Server.Partitioning, cfg.Server.EventStoreSubscription, cfg.Server.StreamSubscription
	suffix := cfg.Server.PriorityLanes.BackfillSuffix
	return subscription.NewConsumer(subscription.Options{
		Events: st.events, Positions: st.positions, Leases: st.leases, Failures: st.failures,
		Handler: handler, Clock: clk,
		Skip: func(ctx context.Context, f position.Fence) error {
			_, err := uow.CommitFenced(ctx, f)
			return err
		},
		Subscriptions: subs,
		Key: func(field string, data json.RawMessage) string {
			if field == "" {
				return ""
			}
			raw, err := partition.FieldValue(data, field)
			if err != nil {
				return ""
			}
			key, err := partition.Validate(raw, suffix)
			if err != nil {
				return ""
			}
			return key
		},
		Head: st.head, Classify: engine.Classify, Owner: owner,
		LeaseTTL: p.LeaseTTL(), Heartbeat: p.HeartbeatInterval(),
		Poll: es.PollInterval(), BatchSize: es.BatchSize, GapTimeout: es.GapTimeout(), KeyWorkers: es.KeyWorkers,
		Retry: ss.Policy(), Metrics: subscription.NewMetrics(reg), Infra: infra, Logger: log,
	})
}

// discardPublisher is the relay's target when the handlers read the event
// store and the broker is inline: no one would read what it kept. It
// reports the inline broker's capabilities.
type discardPublisher struct{ broker.Publisher }

// Publish keeps nothing.
func (discardPublisher) Publish(context.Context, ...delivery.Message) error { return nil }
