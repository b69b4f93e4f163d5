package main

import (
	"log/slog"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proteanhq/protean-host/internal/config"
	"github.com/proteanhq/protean-host/internal/connlimit"
)

// fdReserve is how many file descriptors http.max_connections leaves for
// the stores, the plugins and the logs (at most half the limit).
const fdReserve = 1024

// maxConnections is http.max_connections, lowered with a warning when the
// process's open-file limit would not leave fdReserve beside it: past the
// limit accept fails and every new client waits, which the bound is there
// to prevent.
func maxConnections(want int, log *slog.Logger) int {
	limit, ok := openFileLimit()
	if !ok {
		return want
	}
	room := max(limit-min(fdReserve, limit/2), 1)
	if want > room {
		log.Warn("http.max_connections lowered to fit the open-file limit", "max_connections", want, "open_file_limit", limit, "lowered_to", room)
		return room
	}
	return want
}

// newServer builds the HTTP server of cfg's [http] table over ln, and
// registers its connection metrics.
func newServer(cfg config.HTTP, ln net.Listener, h http.Handler, reg prometheus.Registerer, log *slog.Logger) (*http.Server, net.Listener) {
	l := connlimit.New(ln, maxConnections(cfg.MaxConnections, log))
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "protean_http_connections_open",
			Help: "HTTP connections open (at most http.max_connections)."}, func() float64 { return float64(l.Open()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "protean_http_connections_evicted_total",
			Help: "Idle HTTP connections closed to make room for a new one at http.max_connections."},
			func() float64 { return float64(l.Evicted()) }))
	srv := &http.Server{Handler: h, ReadHeaderTimeout: cfg.ReadHeaderTimeout(), WriteTimeout: cfg.WriteTimeout(),
		IdleTimeout: cfg.IdleTimeout(), MaxHeaderBytes: cfg.MaxHeaderBytes, ConnState: l.ConnState}
	return srv, l
}
