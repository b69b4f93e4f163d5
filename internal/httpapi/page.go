package httpapi

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/proteanhq/protean-host/internal/host"
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
	"join": strings.Join,
	"age":  age,
	"keys": func(m map[string]string) string {
		parts := make([]string, 0, len(m))
		for c, f := range m {
			parts = append(parts, c+" by "+f)
		}
		sort.Strings(parts)
		return strings.Join(parts, ", ")
	},
}).Parse(pageSource))

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
	Now        time.Time
	Healthy    bool
	Plugins    []Plugin
	Reload     *host.ReloadStatus
	Consumers  []Consumer
	Outbox     *Outbox
	Statuses   []string // outbox statuses in a stable order
	Partitions *Partitions
	Problems   []string
	HasStatus  bool
}

func (a *api) page(w http.ResponseWriter, r *http.Request) {
	d := pageData{Now: time.Now().UTC(), Healthy: a.e.Healthy() == nil}
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
	d.Reload, d.Consumers, d.Outbox, d.Partitions, d.Problems = snap.Reload, snap.Consumers, snap.Outbox, snap.Partitions, snap.Problems
	if d.Outbox != nil {
		for s := range d.Outbox.Counts {
			d.Statuses = append(d.Statuses, s)
		}
		sort.Strings(d.Statuses)
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
