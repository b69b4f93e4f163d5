package redisstream_test

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/broker"
	"github.com/proteanhq/protean-host/broker/brokertest"
	"github.com/proteanhq/protean-host/broker/redisstream"
	"github.com/proteanhq/protean-host/internal/testserver"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testserver.Stop()
	os.Exit(code)
}

// client returns a client of the test server and the test's key prefix.
func client(t testing.TB) (*redis.Client, string) {
	t.Helper()
	url, prefix := testserver.Redis(t)
	o, err := redis.ParseURL(url)
	require.NoError(t, err)
	o.PoolSize = 64 // the suite's stress test holds many blocking reads at once
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c, prefix
}

func newBroker(t testing.TB, opts broker.Options) *redisstream.Broker {
	t.Helper()
	c, prefix := client(t)
	b, err := redisstream.New(c, redisstream.Options{Options: opts, Prefix: prefix, Consumer: "test"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func TestConformance(t *testing.T) {
	features := brokertest.Features{
		Ordered:        true,
		HoldTheLine:    true,
		DeadLetters:    true,
		MessageTimeout: true,
		Blocking:       true,
		Stats:          true,
		Deduplicates:   true,
		Clock:          true,
	}
	brokertest.Run(t, features, func(t *testing.T, opts broker.Options) broker.Broker {
		return newBroker(t, opts)
	})
}

var _ = context.Background
