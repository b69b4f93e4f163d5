package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/httpapi"
	"github.com/proteanhq/protean-host/internal/readyourwrites"
	"github.com/proteanhq/protean-host/internal/subscription"
)

// stalledEngine's projector never catches up: a wait ends with its
// context.
type stalledEngine struct {
	fakeEngine
	waited chan int64
}

func (s *stalledEngine) WaitDocument(ctx context.Context, name, _ string, n int64) error {
	s.waited <- n
	<-ctx.Done()
	return &readyourwrites.CaughtUpError{Projection: name, Position: n, Err: ctx.Err()}
}

func TestMinPositionBound(t *testing.T) {
	e := &stalledEngine{waited: make(chan int64, 1)}
	srv := httptest.NewServer(httpapi.New(e, httpapi.Options{ReadWait: 20 * time.Millisecond}))
	defer srv.Close()
	code, body := getJSON(t, srv.URL+"/v1/projections/docs/1?min_position=17")
	require.Equal(t, 504, code, body)
	require.Contains(t, body["error"], "projection docs has not handled global position 17 within 20ms")
	require.Equal(t, int64(17), <-e.waited)

	code, body = getJSON(t, srv.URL+"/v1/projections/docs/1?min_position=seventeen")
	require.Equal(t, 400, code, body)
	require.Len(t, e.waited, 0, "a bad position never waits")

	// Without min_position nothing waits.
	code, _ = getJSON(t, srv.URL+"/v1/projections/docs/1")
	require.Equal(t, 200, code)
	require.Len(t, e.waited, 0)
}

func getJSON(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

// failedEngine's projector failed an event below every wait.
type failedEngine struct{ fakeEngine }

func (*failedEngine) WaitDocument(_ context.Context, name, _ string, n int64) error {
	return &subscription.FailedError{Projection: name, Position: n, Failure: subscription.Failure{GlobalPosition: 5, Type: "OrderPlaced", Stream: "order-o-1", Status: subscription.StatusFailed}}
}

// A wait that reaches an event the projection's handler failed (recorded
// for an operator) answers 500 naming it, at once, not the document.
func TestMinPositionFailedEvent(t *testing.T) {
	srv := httptest.NewServer(httpapi.New(&failedEngine{}, httpapi.Options{ReadWait: time.Minute}))
	defer srv.Close()
	code, body := getJSON(t, srv.URL+"/v1/projections/docs/1?min_position=17")
	require.Equal(t, 500, code, body)
	require.Contains(t, body["error"], "projection docs cannot reach global position 17: its handler failed the OrderPlaced event at global position 5")
}

// cachedEngine holds document docs/1 as of position at in memory; a wait
// for a position up to after ends at once, the document then held as of
// after.
type cachedEngine struct {
	stalledEngine
	at, after atomic.Int64
}

func (c *cachedEngine) CachedDocument(name, id string, n int64) (json.RawMessage, int64, bool) {
	if name != "docs" || id != "1" || n > c.at.Load() {
		return nil, 0, false
	}
	return json.RawMessage(`{"cached":true}`), 9, true
}

func (c *cachedEngine) WaitDocument(ctx context.Context, name, id string, n int64) error {
	if n <= c.after.Load() {
		c.waited <- n
		c.at.Store(c.after.Load())
		return nil
	}
	return c.stalledEngine.WaitDocument(ctx, name, id, n)
}

// A read as of a position the engine's cache holds the document at (or
// later) is answered from it, without waiting; a later position waits.
func TestMinPositionFromTheCache(t *testing.T) {
	e := &cachedEngine{stalledEngine: stalledEngine{waited: make(chan int64, 1)}}
	e.at.Store(20)
	reg := prometheus.NewRegistry()
	srv := httptest.NewServer(httpapi.New(e, httpapi.Options{ReadWait: 20 * time.Millisecond, Registry: reg}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/projections/docs/1?min_position=17")
	require.NoError(t, err)
	defer resp.Body.Close()
	var body map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, map[string]any{"cached": true}, body)
	require.Equal(t, "9", resp.Header.Get("X-Record-Version"))
	require.Len(t, e.waited, 0, "answered without a wait")

	code, _ := getJSON(t, srv.URL+"/v1/projections/docs/1?min_position=21")
	require.Equal(t, 504, code)
	require.Equal(t, int64(21), <-e.waited)
	code, _ = getJSON(t, srv.URL+"/v1/projections/docs/1?min_position=-1")
	require.Equal(t, 400, code)

	// The usual read comes before the projection: its wait ends with the
	// commit that puts the document in memory, which then answers it.
	e.after.Store(30)
	code, body = getJSON(t, srv.URL+"/v1/projections/docs/1?min_position=25")
	require.Equal(t, 200, code)
	require.Equal(t, map[string]any{"cached": true}, body, "from memory, not the database (fakeEngine.Projection)")
	require.Equal(t, int64(25), <-e.waited)

	// A read without min_position reads the database.
	code, _ = getJSON(t, srv.URL+"/v1/projections/docs/1")
	require.Equal(t, 200, code)
	require.Equal(t, map[string]float64{"cache": 2, "database": 1}, projectionReads(t, reg))
}

// projectionReads is protean_projection_reads_total by its label from.
func projectionReads(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "protean_projection_reads_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "from" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}
