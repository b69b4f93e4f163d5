package host

import (
	"context"
	"fmt"
	"time"
)

// Compiled code shared by modules with the same bytes (issue 21).
//
// Tenants that run one module file (the same application, deployed per
// tenant under their own names) compiled it once each: ~24 MB of code per
// Go module, per tenant. Modules whose prepared code, deadline mode and
// memory limit are the same now share one compile: the first load
// compiles it, the others (and the loads meanwhile, which wait for it
// within their own compile deadline) hold it, and the last holder to
// close it closes it. Instances stay each module's own: only the
// read-only machine code is shared, as it is between the instances of
// one module. A compile that fails fails every load that waited for it;
// the next load compiles again.

// sharedCode is one compile, held by refs modules (and loads waiting for
// it).
type sharedCode struct {
	ready chan struct{} // closed once code or err is set
	code  *compiledCode
	err   error
	refs  int // under Loader.shareMu
}

// shareKey is what modules must have in common to share compiled code:
// the code's cache key (its prepared bytes and deadline mode) and the
// memory limit the runtime was built with.
func shareKey(key string, lim Limits) string { return fmt.Sprintf("%s/%dMB", key, lim.MemoryMB) }

// compileShared returns the code compiled from code for the module name,
// compiled by this call or by the load that compiled the same key first.
// Each holder closes its own handle; the code closes with the last.
func (l *Loader) compileShared(ctx context.Context, name string, code []byte, mode string, lim Limits) (*compiledCode, string, error) {
	key := codeKey(code, mode)
	sk := shareKey(key, lim)
	l.shareMu.Lock()
	if s := l.shared[sk]; s != nil {
		s.refs++
		l.shareMu.Unlock()
		c, err := l.awaitShared(ctx, sk, s, lim.compileDeadline(len(code)))
		return c, key, err
	}
	s := &sharedCode{ready: make(chan struct{}), refs: 1}
	l.shared[sk] = s
	l.shareMu.Unlock()
	c, _, err := l.compile(ctx, name, code, mode, lim, false)
	l.shareMu.Lock()
	s.code, s.err = c, err
	if err != nil {
		delete(l.shared, sk) // the loads waiting get the error; the next compiles again
	}
	close(s.ready)
	l.shareMu.Unlock()
	if err != nil {
		return nil, key, err
	}
	return l.holder(sk, s), key, nil
}

// awaitShared waits, within limit and ctx, for the compile s another load
// runs, which the caller has counted itself a holder of.
func (l *Loader) awaitShared(ctx context.Context, sk string, s *sharedCode, limit time.Duration) (*compiledCode, error) {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case <-s.ready:
	case <-timer.C:
		l.drop(sk, s)
		return nil, fmt.Errorf("%w (limit %s, waiting for the same module's compile)", ErrCompileTimeout, limit)
	case <-ctx.Done():
		l.drop(sk, s)
		return nil, fmt.Errorf("%w: %v", ErrCanceled, ctx.Err())
	}
	if s.err != nil {
		return nil, s.err
	}
	return l.holder(sk, s), nil
}

// holder is one module's handle on s: closing it drops that hold.
func (l *Loader) holder(sk string, s *sharedCode) *compiledCode {
	return &compiledCode{CompiledPlugin: s.code.CompiledPlugin, release: func() { l.drop(sk, s) }}
}

// drop ends one hold on s, and closes its code with the last.
func (l *Loader) drop(sk string, s *sharedCode) {
	l.shareMu.Lock()
	s.refs--
	last := s.refs == 0 && s.code != nil
	if last && l.shared[sk] == s {
		delete(l.shared, sk)
	}
	l.shareMu.Unlock()
	if last {
		_ = s.code.close(context.Background())
	}
}
