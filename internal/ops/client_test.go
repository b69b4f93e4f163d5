package ops_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/ops"
)

// A Client maps the host's answers back to the ops errors, with the
// host's message: 403, 404, 409, 400 to their errors, 401 to a message
// that says what to do about the key, any other status to its code.
func TestClientMapsTheAnswersToTheErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		code    int
		body    string
		key     string
		is      error
		message []string
	}{
		{403, `{"error":"forbidden: the credential does not allow this request"}`, "k", ops.ErrForbidden, []string{"403", "forbidden"}},
		{404, `{"error":"no such target: outbox row 9"}`, "k", ops.ErrNotFound, []string{"outbox row 9"}},
		{409, `{"error":"the target's state does not allow this action: not halted"}`, "k", ops.ErrConflict, []string{"not halted"}},
		{400, `{"error":"invalid operation: bad action"}`, "k", ops.ErrInvalid, []string{"bad action"}},
		{401, `{"error":"unauthorized"}`, "", ops.ErrUnauthenticated, []string{"set the environment variable PROTEAN_API_KEY"}},
		{401, `{"error":"unauthorized"}`, "k", ops.ErrUnauthenticated, []string{"check it"}},
		{500, `{"error":"database down"}`, "k", nil, []string{"500", "database down"}},
		{502, `<html>bad gateway</html>`, "k", nil, []string{"502", "bad gateway"}},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(c.code)
			_, _ = w.Write([]byte(c.body))
		}))
		cl, err := ops.NewClient(srv.URL, c.key, 5*time.Second)
		require.NoError(t, err)
		_, err = cl.ActOnOutbox(context.Background(), ops.All(), ops.Act{Action: "retry"}, 9)
		srv.Close()
		require.Error(t, err, "%d", c.code)
		var se *ops.StatusError
		require.ErrorAs(t, err, &se)
		require.Equal(t, c.code, se.Code)
		for _, kind := range []error{ops.ErrForbidden, ops.ErrNotFound, ops.ErrConflict, ops.ErrInvalid, ops.ErrUnauthenticated} {
			require.Equal(t, kind == c.is, errors.Is(err, kind), "%d is %v", c.code, kind)
		}
		for _, m := range c.message {
			require.Contains(t, err.Error(), m, "%d", c.code)
		}
	}
}

// A Client sends the key as a bearer token, escapes each path segment,
// carries the action's group and reason in the body and the audit
// query's bounds in the query, and reads no more than MaxAnswerBytes.
func TestClientRequests(t *testing.T) {
	t.Parallel()
	type seen struct{ method, path, query, auth, body string }
	got := make(chan seen, 1)
	answers := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("Authorization"), string(raw)}
		_, _ = w.Write([]byte(<-answers))
	}))
	defer srv.Close()
	cl, err := ops.NewClient(srv.URL+"/", "pk_secret", 5*time.Second)
	require.NoError(t, err)
	ctx := context.Background()

	answers <- `{"tenant":"shop","action":"skip","target":"t","detail":"d","audit":7}`
	d, err := cl.ActOnPartition(ctx, ops.All(), ops.Act{Action: "skip", Reason: "why"}, "test::order", "a/b c", "client_orders")
	require.NoError(t, err)
	require.Equal(t, int64(7), d.Audit)
	s := <-got
	require.Equal(t, seen{"POST", "/v1/ops/partitions/test::order/a%2Fb%20c/skip", "", "Bearer pk_secret", `{"group":"client_orders","reason":"why"}`}, s)

	answers <- `[{"id":3,"principal":"cli:me","action":"outbox.retry","outcome":"ok"}]`
	es, err := cl.Audit(ctx, ops.All(), audit.Query{Before: 10, Limit: 2})
	require.NoError(t, err)
	require.Len(t, es, 1)
	require.Equal(t, int64(3), es[0].ID)
	s = <-got
	require.Equal(t, "/v1/ops/audit", s.path)
	require.Equal(t, "before=10&limit=2", s.query)

	answers <- `[]`
	_, err = cl.Failures(ctx, ops.All(), true)
	require.NoError(t, err)
	require.Equal(t, "all=true", (<-got).query)

	answers <- `[` + strings.Repeat(`{"tenant":"x"},`, ops.MaxAnswerBytes/14) + `{}]`
	_, err = cl.Partitions(ctx, ops.All())
	<-got
	require.ErrorContains(t, err, "larger than")

	for _, bad := range []string{"", "127.0.0.1:8080", "ftp://h", "http://h/?q=1"} {
		_, err := ops.NewClient(bad, "", time.Second)
		require.Error(t, err, bad)
	}
}
