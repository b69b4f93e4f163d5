package testwait_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/proteanhq/protean-host/internal/testwait"
)

// fatal records a failure and stops the waiting call, as FailNow would.
type fatal struct {
	testing.TB
	msg string
}

type stopped struct{}

func (f *fatal) Helper() {}
func (f *fatal) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(stopped{})
}

// run calls wait with a fake TB and returns the failure it reported.
func run(wait func(tb testing.TB)) (msg string) {
	f := &fatal{}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(stopped); !ok {
				panic(r)
			}
			msg = f.msg
		}
	}()
	wait(f)
	return ""
}

func TestForDiagnosesWhatItSaw(t *testing.T) {
	t.Setenv(testwait.EnvScale, "0.0001") // a limit of a few ms
	n := 0
	msg := run(func(tb testing.TB) {
		testwait.For(tb, "n to reach a million", func() (bool, string) {
			n++
			return false, fmt.Sprintf("n=%d", n)
		})
	})
	require.Contains(t, msg, "waiting for n to reach a million")
	require.Contains(t, msg, fmt.Sprintf("last seen: n=%d", n))
}

func TestForReturnsOnceTheConditionHolds(t *testing.T) {
	n := 0
	testwait.For(t, "three calls", func() (bool, string) { n++; return n == 3, "" })
	require.Equal(t, 3, n)
}

func TestRecv(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	require.Equal(t, 7, testwait.Recv(t, "seven", ch))

	t.Setenv(testwait.EnvScale, "0.0001")
	require.Contains(t, run(func(tb testing.TB) { testwait.Recv(tb, "a value", make(chan int)) }), "waiting for a value")
	close(ch)
	require.Contains(t, run(func(tb testing.TB) { testwait.Recv(tb, "a value", ch) }), "channel closed")
}

func TestLimitScales(t *testing.T) {
	t.Setenv(testwait.EnvScale, "")
	d := testwait.Limit()
	require.GreaterOrEqual(t, d.Seconds(), 60.0)
	t.Setenv(testwait.EnvScale, "2")
	require.Equal(t, 2*d, testwait.Limit())
	t.Setenv(testwait.EnvScale, "nonsense")
	require.Equal(t, d, testwait.Limit(), "an unusable scale is ignored")
}
