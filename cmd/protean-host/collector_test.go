package main

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/outbox"
)

type failingStats struct{}

func (failingStats) Stats(context.Context) (outbox.Stats, error) {
	return outbox.Stats{}, errors.New("database down")
}

func TestOutboxCollectorReportsAFailedRead(t *testing.T) {
	c := &outboxCollector{store: failingStats{}, log: slog.New(slog.DiscardHandler)}
	full := newOutboxCollector(nil, slog.New(slog.DiscardHandler))
	c.rows, c.oldest, c.failures = full.rows, full.oldest, full.failures
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	// The scrape still succeeds (other metrics stay visible) and says the
	// outbox read failed.
	_, err := reg.Gather()
	require.NoError(t, err)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var got []string
	for _, mf := range mfs {
		got = append(got, mf.GetName())
		if mf.GetName() == "protean_outbox_stats_errors_total" {
			require.Equal(t, 2.0, mf.GetMetric()[0].GetCounter().GetValue())
			return
		}
	}
	t.Fatalf("no protean_outbox_stats_errors_total among %v", got)
}
