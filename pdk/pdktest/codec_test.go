package pdktest_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/proteanhq/protean-host/pdk"
	"github.com/proteanhq/protean-host/pdk/pdktest"
)

// recorder is a testing.TB that keeps the failures a check reports.
type recorder struct {
	testing.TB
	failures []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Fatal(args ...any) {
	r.failures = append(r.failures, fmt.Sprint(args...))
	runtime.Goexit()
}

// check runs fn against a recorder in its own goroutine (Fatal ends it)
// and returns what it reported.
func check(t *testing.T, fn func(tb testing.TB)) []string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(r)
	}()
	<-done
	return r.failures
}

type point struct {
	X, Y int64
}

func (p *point) DecodeJSON(b []byte) error {
	return pdk.Fields(b, func(key, value []byte) (err error) {
		if pdk.IsNull(value) {
			return nil
		}
		switch string(key) {
		case "X":
			p.X, err = pdk.Int(value)
		case "Y":
			p.Y, err = pdk.Int(value)
		}
		return err
	})
}

func (p point) AppendJSON(b []byte) ([]byte, error) {
	return fmt.Appendf(b, `{"X":%d,"Y":%d}`, p.X, p.Y), nil
}

// swapped writes its fields the wrong way round.
type swapped struct{ point }

func (s swapped) AppendJSON(b []byte) ([]byte, error) {
	return fmt.Appendf(b, `{"X":%d,"Y":%d}`, s.Y, s.X), nil
}

// strict fails on the fields it does not know.
type strict struct{ X int64 }

func (s *strict) DecodeJSON(b []byte) error {
	return pdk.Fields(b, func(key, value []byte) (err error) {
		if string(key) != "X" {
			return fmt.Errorf("unknown field %s", key)
		}
		s.X, err = pdk.Int(value)
		return err
	})
}

type plain struct{ X int }

func TestCodec(t *testing.T) {
	if f := check(t, func(tb testing.TB) { pdktest.Codec(tb, point{}, point{X: 1, Y: -2}) }); len(f) != 0 {
		t.Fatalf("a right codec failed: %q", f)
	}
	cases := []struct {
		name string
		run  func(tb testing.TB)
		want string
	}{
		{"no codec", func(tb testing.TB) { pdktest.Codec(tb, plain{X: 1}) }, "implements neither"},
		{"wrong encoding", func(tb testing.TB) { pdktest.Codec(tb, swapped{point{X: 1, Y: 2}}) }, "which encoding/json reads as"},
		{"unknown fields", func(tb testing.TB) { pdktest.Codec(tb, strict{X: 1}) }, "with unknown fields"},
	}
	for _, c := range cases {
		f := check(t, c.run)
		if len(f) == 0 || !strings.Contains(strings.Join(f, "\n"), c.want) {
			t.Errorf("%s: reported %q, want a failure with %q", c.name, f, c.want)
		}
	}
}
