package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/deploy"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/testlog"
)

// faulty is a Deployer over a directory holding m.wasm ("v1"), whose
// reload is reload.
func faulty(t *testing.T, reload func(dir string) func(context.Context) (host.Outcome, []error)) (*deploy.Deployer, string, *testlog.Buffer, *audit.Memory) {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "m.wasm"), []byte("v1"), 0o644))
	logs, log := &testlog.Buffer{}, audit.NewMemory(nil)
	d := deploy.New(deploy.Options{Dir: dir, Reload: reload(dir), Audit: log, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	return d, dir, logs, log
}

func rejectAlways(string) func(context.Context) (host.Outcome, []error) {
	return func(context.Context) (host.Outcome, []error) {
		return host.Rejected, []error{&host.LoadError{File: "m.wasm", Err: host.ErrNotWASM}}
	}
}

// A directory the reload rejects even once restored: the restore stands,
// and the second rejection is logged.
func TestARestoredDirectoryRejectedTooIsLogged(t *testing.T) {
	d, dir, logs, _ := faulty(t, rejectAlways)
	_, err := d.Put(context.Background(), "key:test", "m", bytes.NewReader([]byte("v2")))
	var rej *deploy.RejectedError
	require.ErrorAs(t, err, &rej)
	require.ErrorIs(t, err, host.ErrNotWASM, "the problems are the error's")
	b, err := os.ReadFile(filepath.Join(dir, "m.wasm"))
	require.NoError(t, err)
	require.Equal(t, "v1", string(b))
	require.Contains(t, logs.String(), `msg="deploy: the restored plugins directory is rejected too" module=m`)
}

// A reload canceled without a problem names the cancellation.
func TestACanceledReloadWithoutProblemsNamesTheCause(t *testing.T) {
	d, _, _, _ := faulty(t, func(string) func(context.Context) (host.Outcome, []error) {
		return func(context.Context) (host.Outcome, []error) { return host.Canceled, nil }
	})
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("shutting down"))
	_, err := d.Put(ctx, "key:test", "m", bytes.NewReader([]byte("v2")))
	var rej *deploy.RejectedError
	require.ErrorAs(t, err, &rej)
	require.Equal(t, host.Canceled, rej.Outcome)
	require.ErrorContains(t, err, "reload canceled: shutting down")
}

// A previous version that cannot be put back is said so, beside the
// rejection.
func TestAPreviousVersionThatCannotBePutBackIsReported(t *testing.T) {
	d, _, _, log := faulty(t, func(dir string) func(context.Context) (host.Outcome, []error) {
		return func(context.Context) (host.Outcome, []error) {
			_ = os.RemoveAll(dir) // the directory goes away under the deploy
			return host.Rejected, []error{errors.New("no *.wasm files")}
		}
	})
	_, err := d.Put(context.Background(), "key:test", "m", bytes.NewReader([]byte("v2")))
	var rej *deploy.RejectedError
	require.ErrorAs(t, err, &rej)
	require.ErrorContains(t, err, "module m: the previous version could not be put back")
	es, lerr := log.List(context.Background(), audit.Query{})
	require.NoError(t, lerr)
	require.Len(t, es, 1)
	require.Equal(t, err.Error(), es[0].Outcome)
}

// A plugins directory that is not there: every action fails before a
// reload, and says why.
func TestAMissingDirectoryFailsEveryAction(t *testing.T) {
	reloads := 0
	dir := filepath.Join(t.TempDir(), "gone")
	d := deploy.New(deploy.Options{Dir: dir, Audit: audit.NewMemory(nil),
		Reload: func(context.Context) (host.Outcome, []error) { reloads++; return host.Applied, nil }})
	ctx := context.Background()
	_, err := d.Put(ctx, "key:test", "m", bytes.NewReader([]byte("v1")))
	require.ErrorIs(t, err, os.ErrNotExist)
	_, err = d.Remove(ctx, "key:test", "m")
	require.ErrorIs(t, err, deploy.ErrNotFound)
	_, err = d.List(ctx, nil)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Zero(t, reloads)
}
