package host

import (
	"cmp"
	"slices"
	"time"
)

// What each tenant uses of the host (issue 21, "visible per tenant"): its
// modules' instances, the memory they hold, their compiled code, and the
// time its guest calls ran, summed per Module.Tenant from the modules'
// own counts, beside its share of the guest slots (fairshare.go).
//
// Guest time is wall time, not CPU time: Go cannot read one goroutine's
// CPU time, and a guest call runs on the caller's goroutine, so a call's
// time is measured from the moment it enters the guest to its return. It
// includes the host functions the guest called (a load, a stream read)
// and any time the goroutine waited for a core; it leaves out the wait
// for a slot and an instance and an instance's start.
//
// Compiled code is an estimate: wazero tells no compiled module's size.
// The estimate is the module file's size times codeFactor, the ratio of
// the compiled code wazero writes to its file cache (machine code and its
// tables, for the instrumented module) to the module file, measured on
// the example modules (Go wasip1 builds: 4.07 for each of the five).
// TestCodeEstimateTracksTheCompiledCache pins it within 2x. A module whose
// file carries mostly data (large data or custom sections) compiles to
// less than the estimate; the Extism kernel, compiled once per host, is
// nobody's.
const codeFactor = 4

// Usage is one running module's use of the host: the guest calls that
// ran in an instance since it loaded and their wall time, the bytes its
// live instances' linear memories hold now (the memory meters, kernel
// memory included), and an estimate of its compiled code in memory (0
// while the code is released, see Limits.CodeIdle).
type Usage struct {
	Calls            int64   `json:"calls"`
	GuestSeconds     float64 `json:"guest_seconds"`
	GuestMemoryBytes uint64  `json:"guest_memory_bytes"`
	CodeBytes        int64   `json:"code_bytes_estimate"`
}

// Usage reads the module's use of the host.
func (m *Module) Usage() Usage {
	p := m.pool
	u := Usage{Calls: p.calls.Load(), GuestSeconds: time.Duration(p.ranNanos.Load()).Seconds()}
	p.mu.Lock()
	for mm := range p.meters {
		u.GuestMemoryBytes += mm.used.Load()
	}
	loaded := p.compiled != nil
	p.mu.Unlock()
	if loaded && m.stat != nil {
		u.CodeBytes = m.stat.Size() * codeFactor
	}
	return u
}

// ran counts a call that ran for d in an instance, for the module and
// for its tenant's share.
func (m *Module) ran(d time.Duration) {
	m.pool.calls.Add(1)
	m.pool.ranNanos.Add(int64(d))
	m.share.ran(d)
}

// metered adds a live instance's memory meter (live) or removes a closed
// one's.
func (p *pool) metered(mm *memoryMeter, live bool) {
	if mm == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !live {
		delete(p.meters, mm)
		return
	}
	if p.meters == nil {
		p.meters = map[*memoryMeter]struct{}{}
	}
	p.meters[mm] = struct{}{}
}

// TenantStats are one tenant's use of the host: its running modules
// (files, sorted), their instances live and idle, guest memory and
// compiled code (Usage, summed), its calls and guest time, and its share
// of the guest slots (nil when the host shares none).
//
// Calls and GuestSeconds are the share's when there is one: since the
// host started, so a reload does not take them back. Without a share they
// are the sums of the running modules' Usage, each since it loaded.
type TenantStats struct {
	Tenant           string
	Modules          []string
	Live, Idle       int
	Calls            int64
	GuestSeconds     float64
	GuestMemoryBytes uint64
	CodeBytes        int64
	Share            *ShareStats
}

// Tenants reads each tenant's use of the host: the tenants of mods (a
// running set's modules) and those sched has seen, sorted by name. sched
// may be nil.
func Tenants(mods []*Module, sched *Scheduler) []TenantStats {
	by := map[string]*TenantStats{}
	get := func(tenant string) *TenantStats {
		if t := by[tenant]; t != nil {
			return t
		}
		t := &TenantStats{Tenant: tenant}
		by[tenant] = t
		return t
	}
	for _, m := range mods {
		t, in, u := get(tenantOf(m.Tenant)), m.Instances(), m.Usage()
		t.Modules = append(t.Modules, m.File)
		t.Live += in.Live
		t.Idle += in.Idle
		t.Calls += u.Calls
		t.GuestSeconds += u.GuestSeconds
		t.GuestMemoryBytes += u.GuestMemoryBytes
		t.CodeBytes += u.CodeBytes
	}
	for _, st := range sched.Stats() {
		t := get(st.Tenant)
		t.Share = &st
		t.Calls, t.GuestSeconds = st.Calls, st.GuestSeconds
	}
	out := make([]TenantStats, 0, len(by))
	for _, t := range by {
		slices.Sort(t.Modules)
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b TenantStats) int { return cmp.Compare(a.Tenant, b.Tenant) })
	return out
}
