package audit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

func logs() map[string]func(t *testing.T) audit.Log {
	return map[string]func(t *testing.T) audit.Log{
		"memory":   func(*testing.T) audit.Log { return audit.NewMemory(nil) },
		"postgres": func(t *testing.T) audit.Log { return audit.NewPostgres(testserver.PostgresPool(t)) },
	}
}

func TestLog(t *testing.T) {
	for name, open := range logs() {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			l := open(t)
			at := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
			var ids []int64
			for i, tenant := range []string{"acme", "beta", "acme", ""} {
				id, err := l.Append(ctx, audit.Entry{At: at.Add(time.Duration(i) * time.Second), Principal: "key:abc", Tenant: tenant,
					Action: "partitions.resume", Target: "order:c-" + string(rune('1'+i)), Outcome: audit.OK, Reason: "fixed"})
				require.NoError(t, err)
				ids = append(ids, id)
			}
			require.IsIncreasing(t, ids)

			all, err := l.List(ctx, audit.Query{})
			require.NoError(t, err)
			require.Len(t, all, 4)
			require.Equal(t, ids[3], all[0].ID, "newest first")
			require.Equal(t, "order:c-1", all[3].Target)
			require.True(t, all[3].At.Equal(at))
			require.Equal(t, "fixed", all[3].Reason)

			acme, err := l.List(ctx, audit.Query{Tenants: []string{"acme"}})
			require.NoError(t, err)
			require.Len(t, acme, 2)
			for _, e := range acme {
				require.Equal(t, "acme", e.Tenant)
			}
			none, err := l.List(ctx, audit.Query{Tenants: []string{}})
			require.NoError(t, err)
			require.Empty(t, none, "an empty tenant list selects nothing")
			require.NotNil(t, none)

			page, err := l.List(ctx, audit.Query{Before: ids[2], Limit: 1})
			require.NoError(t, err)
			require.Len(t, page, 1)
			require.Equal(t, ids[1], page[0].ID)

			_, err = l.Append(ctx, audit.Entry{Tenant: "acme"})
			require.ErrorIs(t, err, audit.ErrInvalid)

			id, err := l.Append(ctx, audit.Entry{Action: "outbox.retry", Tenant: "acme", Outcome: strings.Repeat("x", 10*audit.MaxFieldBytes)})
			require.NoError(t, err)
			got, err := l.List(ctx, audit.Query{Limit: 1})
			require.NoError(t, err)
			require.Equal(t, id, got[0].ID)
			require.Len(t, got[0].Outcome, audit.MaxFieldBytes, "a long field is cut")
			require.False(t, got[0].At.IsZero(), "an entry without a time takes the log's")
		})
	}
}

func TestOutcome(t *testing.T) {
	require.Equal(t, audit.OK, audit.Outcome(nil))
	require.Equal(t, "context deadline exceeded", audit.Outcome(context.DeadlineExceeded))
}
