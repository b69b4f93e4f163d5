package host

import (
	"sync"
	"time"

	"github.com/proteanhq/protean-host/clock"
)

// maxReapTick bounds how long an instance may outlive its InstanceIdle:
// the reaper sweeps at a quarter of the shortest InstanceIdle of its
// modules, and at least this often.
const maxReapTick = time.Second

// reaper closes the instances its modules' pools kept idle past their
// InstanceIdle (Module.reapIdle). One goroutine per Loader sweeps every
// module, rather than a timer per module: a host of many modules pays one
// wake-up a tick, and a sweep of a module with nothing to close is a lock
// and a comparison. The goroutine runs only while a module with a
// positive InstanceIdle is loaded: it starts with the first, stops with
// the last module's Close or the Loader's.
type reaper struct {
	clk clock.Clock

	mu     sync.Mutex
	mods   map[*Module]struct{}
	stop   chan struct{} // non-nil while the goroutine runs
	done   chan struct{} // closed when it has returned
	closed bool          // the Loader closed: no goroutine starts again
}

func newReaper(clk clock.Clock) *reaper {
	return &reaper{clk: clock.Or(clk), mods: map[*Module]struct{}{}}
}

// add has m's idle instances reaped, if m has an InstanceIdle, and its
// code released, if it may be (Limits.CodeIdle).
func (r *reaper) add(m *Module) {
	if m.Limits.InstanceIdle <= 0 && m.recompile == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.mods[m] = struct{}{}
	if r.stop == nil {
		r.stop, r.done = make(chan struct{}), make(chan struct{})
		go r.run(r.stop, r.done)
	}
}

// remove stops reaping m, and stops the goroutine (waiting for it) when
// m was the last module.
func (r *reaper) remove(m *Module) {
	r.mu.Lock()
	if _, ok := r.mods[m]; !ok {
		r.mu.Unlock()
		return
	}
	delete(r.mods, m)
	if len(r.mods) > 0 {
		r.mu.Unlock()
		return
	}
	r.halt()
}

// close stops the goroutine for good (Loader.Close): the modules still
// loaded keep their idle instances.
func (r *reaper) close() {
	r.mu.Lock()
	r.closed = true
	clear(r.mods)
	r.halt()
}

// halt, called with r.mu held, releases it, stops the goroutine if it
// runs, and waits for it to return.
func (r *reaper) halt() {
	stop, done := r.stop, r.done
	r.stop, r.done = nil, nil
	r.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
}

func (r *reaper) run(stop, done chan struct{}) {
	defer close(done)
	for {
		select {
		case <-stop:
			return
		case <-r.clk.After(r.tick()):
		}
		now := r.clk.Now()
		for _, m := range r.modules() {
			select {
			case <-stop:
				return
			default:
			}
			if n := m.reapIdle(now); n > 0 {
				m.log.Debug("idle instances closed", "module", m.File, "closed", n, "instance_idle", m.Limits.InstanceIdle)
			}
			if m.releaseCode(now) {
				m.log.Debug("idle code released", "module", m.File, "code_idle", m.Limits.CodeIdle)
			}
		}
	}
}

// tick is a quarter of the shortest InstanceIdle or CodeIdle, at most
// maxReapTick.
func (r *reaper) tick() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := maxReapTick
	for m := range r.mods {
		if m.Limits.InstanceIdle > 0 {
			t = min(t, m.Limits.InstanceIdle/4)
		}
		if m.Limits.CodeIdle > 0 && m.recompile != nil { // in this order: see loadCode
			t = min(t, m.Limits.CodeIdle/4)
		}
	}
	return max(t, time.Millisecond)
}

func (r *reaper) modules() []*Module {
	r.mu.Lock()
	defer r.mu.Unlock()
	mods := make([]*Module, 0, len(r.mods))
	for m := range r.mods {
		mods = append(mods, m)
	}
	return mods
}
