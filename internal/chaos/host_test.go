package chaos

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// Compiled waits while /healthz reads "starting" and returns once it
// reads "ok".
func TestCompiledWaitsForTheHealthToReadOK(t *testing.T) {
	t.Parallel()
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, "/healthz", r.URL.Path)
		if asked.Add(1) <= 3 {
			_, _ = w.Write([]byte(`{"status":"starting","plugins":5,"compiling":2}`))
			return
		}
		_, _ = w.Write([]byte(`{"status":"ok","plugins":5}`))
	}))
	defer srv.Close()
	h := &Host{Addr: strings.TrimPrefix(srv.URL, "http://")}
	require.NoError(t, h.Compiled(context.Background()))
	require.EqualValues(t, 4, asked.Load(), "it asked until the health read ok, and no more")
}
