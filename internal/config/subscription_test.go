package config_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/config"
)

// The delivery picked when default_subscription_type is unset: the event
// store with PostgreSQL stores and the inline broker (crash-safe without
// Redis), the broker stream otherwise; as set when set.
func TestSubscriptionType(t *testing.T) {
	t.Parallel()
	pg := `[databases.default]
provider = "postgresql"
database_uri = "postgres://h/db"
[event_store]
provider = "message_db"
database_uri = "postgres://h/db"
`
	redis := `[brokers.default]
provider = "redis"
uri = "redis://h:6379/0"
`
	for _, tc := range []struct {
		name, toml, want, problem string
	}{
		{name: "embedded", toml: ``, want: config.SubscriptionStream},
		{name: "postgres inline", toml: pg, want: config.SubscriptionEventStore},
		{name: "postgres redis", toml: pg + redis, want: config.SubscriptionStream},
		{name: "set stream", toml: "[server]\ndefault_subscription_type = \"stream\"\n" + pg, want: config.SubscriptionStream},
		{name: "set event_store", toml: "[server]\ndefault_subscription_type = \"event_store\"\n", want: config.SubscriptionEventStore},
		{name: "bad", toml: "[server]\ndefault_subscription_type = \"broker\"\n", problem: "server.default_subscription_type"},
		{name: "bad gap", toml: "[server.event_store_subscription]\ngap_timeout_ms = 0\n", problem: "server.event_store_subscription.gap_timeout_ms must be > 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "c.toml")
			require.NoError(t, os.WriteFile(path, []byte(tc.toml), 0o600))
			cfg, err := config.Load(path)
			if tc.problem != "" {
				require.ErrorContains(t, err, tc.problem)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, cfg.SubscriptionType())
		})
	}
}
