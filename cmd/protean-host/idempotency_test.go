package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/httpapi"
	"github.com/proteanhq/protean-host/internal/testserver"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

// postKeyed posts a command with an Idempotency-Key; safe on any goroutine.
func postKeyed(h *testHost, typ, key, body string) (int, string, string, error) {
	req, err := http.NewRequest(http.MethodPost, "http://"+h.addr+"/v1/commands/"+typ, strings.NewReader(body))
	if err != nil {
		return 0, "", "", err
	}
	req.Header.Set(httpapi.IdempotencyHeader, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get(httpapi.ReplayedHeader), err
}

// An idempotent PlaceOrder repeated ten times at once runs once: every
// answer is the first (the same event id), and the store holds one event
// (PlaceOrder expects no stream, so a second run would have answered 409).
// The same key with another body answers 422. On the embedded memory
// stores and on PostgreSQL (where the key row commits in the command's
// unit of work).
func TestIdempotentCommandRunsOnce(t *testing.T) {
	dir := wasmbuild.Examples(t)
	for _, name := range []string{"memory", "postgres"} {
		t.Run(name, func(t *testing.T) {
			var pool *pgxpool.Pool
			change := func(*config.Config) {}
			if name == "postgres" {
				pool = testserver.PostgresPool(t)
				url := pool.Config().ConnString()
				change = func(c *config.Config) {
					c.Databases[config.DefaultName] = config.Database{Provider: config.ProviderPostgreSQL, DatabaseURI: url}
					c.EventStore = config.EventStore{Provider: config.ProviderMessageDB, DatabaseURI: url}
				}
			}
			h, err := startHostWith(t, "domain.toml", dir, change)
			require.NoError(t, err)

			body := `{"order_id":"o-1","client_id":"c-1","total":42.5}`
			type answer struct {
				code           int
				body, replayed string
				err            error
			}
			answers := make(chan answer, 10)
			var wg sync.WaitGroup
			for range 10 {
				wg.Go(func() {
					code, b, replayed, err := postKeyed(h, "PlaceOrder", "k-1", body)
					answers <- answer{code, b, replayed, err}
				})
			}
			wg.Wait()
			close(answers)
			var first string
			replayed := 0
			for a := range answers {
				require.NoError(t, a.err)
				require.Equal(t, http.StatusOK, a.code, a.body)
				if first == "" {
					first = a.body
				}
				require.Equal(t, first, a.body, "every repeat gets the first answer, byte for byte")
				if a.replayed == "true" {
					replayed++
				}
			}
			require.Equal(t, 9, replayed)
			require.Contains(t, first, `"stream":"order-o-1"`)

			code, b, _, err := postKeyed(h, "PlaceOrder", "k-1", `{"order_id":"o-1","client_id":"c-1","total":1}`)
			require.NoError(t, err)
			require.Equal(t, http.StatusUnprocessableEntity, code, b)

			if pool != nil {
				ctx := context.Background()
				require.Equal(t, 1, count(t, pool, `SELECT count(*) FROM message_store.messages WHERE stream_name = 'order-o-1'`))
				var stored string
				require.NoError(t, pool.QueryRow(ctx, `SELECT convert_from(body, 'UTF8') FROM idempotency_keys WHERE scope = 'PlaceOrder' AND key = 'k-1' AND state = 'done'`).Scan(&stored))
				require.Equal(t, first, stored)
			}
		})
	}
}
