// Package faultproxy is a TCP proxy for tests and the chaos harness that
// breaks connections the ways a network does: it cuts them (reset and
// refuse) or stalls one direction, and resumes. Put one between a client
// and PostgreSQL or Redis to test what the client does when its server
// becomes unreachable or silent, without touching the server.
package faultproxy
