package httpapi

import (
	"bytes"
	"cmp"
	_ "embed"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/proteanhq/protean-host/internal/audit"
	"github.com/proteanhq/protean-host/internal/host"
	"github.com/proteanhq/protean-host/internal/ops"
)

// The status page (GET /) is rendered on the server from one template
// with its CSS inline: nothing to build, no script, and it refreshes
// itself every few seconds. It shows what GET /v1/plugins and the Status
// show, for a person.

//go:embed status.html
var pageSource string

var pageTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"short": func(s string) string {
		if len(s) > 12 {
			return s[:12]
		}
		return s
	},
	"join":  strings.Join,
	"age":   age,
	"bytes": bytesText,
	"secs":  secs,
}).Parse(pageSource))

// bytesText renders a size for people: "512 B", "3.2 MiB", "16.1 GiB".
func bytesText(n any) string {
	var v float64
	switch n := n.(type) {
	case int64:
		v = float64(n)
	case uint64:
		v = float64(n)
	case int:
		v = float64(n)
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", v)
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}

// secs renders seconds for people, to the millisecond below a minute:
// "0.012s", "3.400s", "2m5s"; a bucket bound past the last is "> 10s".
func secs(s float64) string {
	switch {
	case math.IsInf(s, 1):
		return fmt.Sprintf("> %gs", host.WaitBuckets[len(host.WaitBuckets)-1])
	case s < 60:
		return fmt.Sprintf("%.3fs", s)
	}
	return time.Duration(s * float64(time.Second)).Truncate(time.Second).String()
}

// age renders a duration for people: "850ms", "12s", "3m4s", "2h5m".
func age(d time.Duration) string {
	switch {
	case d <= 0:
		return "—"
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.0fs", d.Seconds())
	case d < time.Hour:
		return d.Truncate(time.Second).String()
	}
	return d.Truncate(time.Minute).String()
}

// pageData is what the template renders.
type pageData struct {
	Now     time.Time
	Healthy bool
	// Version and Uptime are the host's build and how long it has run
	// (zero when the API was not told its start).
	Version    string
	Uptime     time.Duration
	Plugins    []Plugin
	Reload     *host.ReloadStatus
	Consumers  []Consumer
	Outbox     *Outbox
	Statuses   []string // outbox statuses in a stable order
	Partitions *Partitions
	Pools      []Pool
	// Usage is each tenant's use of the guests (Snapshot.Tenants).
	Usage     []host.TenantStats
	Problems  []string
	HasStatus bool
	// Tenants names the tenants an operator's page is kept to ("" for
	// the whole host's page).
	Tenants string
	// Audit is the newest entries of the audit log the page's scope
	// sees; HasAudit says the host keeps one.
	Audit    []audit.Entry
	HasAudit bool
}

// pageAudit is how many audit entries the page shows.
const pageAudit = 20

func (a *api) page(w http.ResponseWriter, r *http.Request) {
	d := pageData{Now: time.Now().UTC(), Healthy: a.e.Healthy() == nil, Version: a.version}
	if !a.started.IsZero() {
		d.Uptime = time.Since(a.started)
	}
	var snap Snapshot
	if a.status != nil {
		var err error
		snap, err = a.status.Status(r.Context())
		if err != nil {
			snap.Problems = append(snap.Problems, err.Error())
		}
		d.HasStatus = true
	}
	d.Plugins = Plugins(a.e.Set(), snap.Reload)
	d.Reload, d.Consumers, d.Outbox, d.Partitions, d.Pools, d.Problems = snap.Reload, snap.Consumers, snap.Outbox, snap.Partitions, snap.Pools, snap.Problems
	d.Usage = snap.Tenants
	if d.Outbox != nil {
		for s := range d.Outbox.Counts {
			d.Statuses = append(d.Statuses, s)
		}
		sort.Strings(d.Statuses)
	}
	sc := scopeOf(r)
	if !sc.IsAll() {
		d.keep(sc, ops.TenancyOf(a.e.Set()))
	}
	if a.ops != nil {
		d.HasAudit = true
		es, err := a.ops.Audit(r.Context(), sc, audit.Query{Limit: pageAudit})
		if err != nil {
			d.Problems = append(d.Problems, "audit log: "+err.Error())
		}
		d.Audit = es
	}
	var b bytes.Buffer
	if err := pageTemplate.Execute(&b, d); err != nil {
		a.log.Error("status page", "error", err)
		writeError(w, http.StatusInternalServerError, "rendering the status page: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b.Bytes())
}

// keep cuts d to an operator's part of the page: the modules, handlers,
// consumers, partitions and use of the scope's tenants, and the reload's
// changes to those modules. The outbox's counts, the connection pools and
// the files a reload rejected are the whole host's (no tenant is known
// for them): an admin's.
func (d *pageData) keep(sc ops.Scope, t ops.Tenancy) {
	tenants := ""
	for _, p := range d.Plugins {
		if p.Tenant != "" && sc.Has(p.Tenant) && !strings.Contains(","+tenants+",", ","+p.Tenant+",") {
			tenants = strings.TrimPrefix(tenants+","+p.Tenant, ",")
		}
	}
	d.Tenants = cmp.Or(tenants, "none of this host's")
	files := map[string]bool{}
	d.Plugins = slices.DeleteFunc(d.Plugins, func(p Plugin) bool {
		files[p.File] = p.State == "running" && sc.Has(p.Tenant)
		return !files[p.File]
	})
	if d.Reload != nil {
		r := *d.Reload
		r.Changes = slices.DeleteFunc(slices.Clone(r.Changes), func(c host.ModuleChange) bool { return !files[c.File] })
		r.Problems, r.Rejected = nil, nil
		d.Reload = &r
	}
	d.Consumers = slices.DeleteFunc(d.Consumers, func(c Consumer) bool { return !sc.Has(t.Handlers[c.Group]) })
	d.Usage = slices.DeleteFunc(d.Usage, func(u host.TenantStats) bool { return !sc.Has(u.Tenant) })
	if d.Partitions != nil {
		out := func(u Unit) bool { return !sc.Has(t.Handlers[u.Group]) }
		d.Partitions = &Partitions{Owned: slices.DeleteFunc(d.Partitions.Owned, out), Halted: slices.DeleteFunc(d.Partitions.Halted, out)}
	}
	d.Outbox, d.Statuses, d.Pools = nil, nil, nil
}
