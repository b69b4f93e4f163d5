package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/engine"
	"github.com/proteanhq/protean-host/internal/httpapi"
	"github.com/proteanhq/protean-host/internal/idempotency"
)

// countingEngine answers each command with a new id, after waiting until
// the test's requests have all been sent, and counts the calls.
type countingEngine struct {
	fakeEngine
	calls, sent atomic.Int32
	want        int32
	code        error
}

func (c *countingEngine) Dispatch(ctx context.Context, typ string, data json.RawMessage, md abi.Metadata) (*engine.CommandResult, error) {
	n := c.calls.Add(1)
	for c.sent.Load() < c.want {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	if c.code != nil {
		return nil, c.code
	}
	return &engine.CommandResult{ID: fmt.Sprintf("run-%d", n)}, nil
}

type answer struct {
	code     int
	body     string
	replayed string
}

func post(t *testing.T, url, key, body string) answer {
	req, err := http.NewRequest(http.MethodPost, url+"/v1/commands/PlaceOrder", strings.NewReader(body))
	if err != nil {
		return answer{body: err.Error()}
	}
	if key != "" {
		req.Header.Set(httpapi.IdempotencyHeader, key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{body: err.Error()}
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return answer{res.StatusCode, string(b), res.Header.Get(httpapi.ReplayedHeader)}
}

// Ten concurrent POSTs with one Idempotency-Key and body run the command
// once and all get its answer; the same key with another body answers
// 422; a rejected command's answer is stored, a conflict's is not.
func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	e := &countingEngine{want: 10}
	srv := httptest.NewServer(httpapi.New(e, httpapi.Options{Idempotency: idempotency.NewMemory(time.Hour, nil)}))
	t.Cleanup(srv.Close)

	answers := make(chan answer, 10)
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			e.sent.Add(1)
			answers <- post(t, srv.URL, "k-1", `{"order_id":"o-1"}`)
		})
	}
	wg.Wait()
	close(answers)
	replayed := 0
	for a := range answers {
		require.Equal(t, http.StatusOK, a.code, a.body)
		require.JSONEq(t, `{"id":"run-1","events":null}`, a.body)
		if a.replayed == "true" {
			replayed++
		}
	}
	require.Equal(t, int32(1), e.calls.Load(), "the command ran once")
	require.Equal(t, 9, replayed)

	a := post(t, srv.URL, "k-1", `{"order_id":"o-2"}`)
	require.Equal(t, http.StatusUnprocessableEntity, a.code, a.body)
	require.Contains(t, a.body, "another request body")
	require.Equal(t, int32(1), e.calls.Load())

	a = post(t, srv.URL, "", `{"order_id":"o-1"}`)
	require.Equal(t, http.StatusOK, a.code)
	require.Equal(t, int32(2), e.calls.Load(), "without a key every request runs")

	e.code = engine.ErrUnknownCommand
	for range 2 {
		require.Equal(t, http.StatusNotFound, post(t, srv.URL, "k-404", `{}`).code)
	}
	require.Equal(t, int32(3), e.calls.Load(), "a 4xx answer is stored")

	e.code = fmt.Errorf("boom")
	for range 2 {
		require.Equal(t, http.StatusInternalServerError, post(t, srv.URL, "k-500", `{}`).code)
	}
	require.Equal(t, int32(5), e.calls.Load(), "a 5xx answer is not stored: the retry runs")

	require.Equal(t, http.StatusBadRequest, post(t, srv.URL, strings.Repeat("k", 256), `{}`).code)
}
