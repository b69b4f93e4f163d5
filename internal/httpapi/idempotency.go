package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/proteanhq/protean-host/eventstore"
	"github.com/proteanhq/protean-host/internal/engine"
	"github.com/proteanhq/protean-host/internal/idempotency"
	"github.com/proteanhq/protean-host/internal/unitofwork"
)

// IdempotencyHeader names the header of an idempotent command.
const IdempotencyHeader = "Idempotency-Key"

// ReplayedHeader is set to "true" on an answer replayed from a stored key.
const ReplayedHeader = "Idempotent-Replayed"

// idempotentCommand serves POST /v1/commands/{type}: without an
// Idempotency-Key it is command; with one, concurrent and later repeats of
// the same key and body get the first answer without running the command
// again, and the same key with another body answers 422.
//
// Stored answers: 2xx, and 4xx but 408, 409 and 429 (a rejected command is
// rejected again; a conflict or a throttle may pass on a retry); never 5xx
// (a failure of ours: the retry runs the command again). On PostgreSQL the
// key is written in the command's own unit of work (so effects and key
// commit together), then replaced by the full answer.
func (a *api) idempotentCommand(w http.ResponseWriter, r *http.Request) {
	if why := checkHeaders(r.Header.Get); why != "" {
		writeError(w, http.StatusBadRequest, why)
		return
	}
	body, ok := a.readBody(w, r)
	if !ok {
		return
	}
	key := r.Header.Get(IdempotencyHeader)
	if key == "" || a.idem == nil {
		a.command(w, r, body)
		return
	}
	req := idempotency.Request{Scope: idempotencyScope(r), Key: key, Hash: idempotency.HashBody(body)}
	stored, done, err := a.idem.Begin(r.Context(), req)
	switch {
	case errors.Is(err, idempotency.ErrMismatch):
		writeError(w, http.StatusUnprocessableEntity, fmt.Sprintf("%s %q was used with another request body", IdempotencyHeader, key))
		return
	case err != nil:
		a.log.Error("idempotency key", "key", key, "error", err)
		writeError(w, http.StatusInternalServerError, "idempotency key: "+err.Error())
		return
	}
	answered := false
	defer func() { done(answered) }()
	if stored != nil {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(ReplayedHeader, "true")
		w.WriteHeader(stored.Status)
		_, _ = w.Write(stored.Body)
		return
	}
	ctx := r.Context()
	var committed committedAnswer
	if kw, ok := a.idem.(unitofwork.KeyWriter); ok {
		ctx = unitofwork.WithIdempotency(ctx, kw, req, committed.build)
	}
	r = r.WithContext(ctx)
	rec := &recorder{header: w.Header(), code: http.StatusOK}
	a.command(rec, r, body)
	switch {
	case !storable(rec.code):
	case committed.is(rec.code, rec.body.Bytes()):
		answered = true // by the unit of work
	default:
		// The command ran: its answer is kept even if the client is gone.
		if err := a.idem.Save(context.WithoutCancel(r.Context()), req, idempotency.Answer{Status: rec.code, Body: rec.body.Bytes()}); err != nil {
			// The command ran: answer it. On PostgreSQL its unit of work
			// stored the key already; a repeat gets that answer.
			a.log.Error("idempotency key: save", "key", key, "error", err)
		} else {
			answered = true
		}
	}
	w.WriteHeader(rec.code)
	_, _ = w.Write(rec.body.Bytes())
}

func storable(code int) bool {
	switch {
	case code >= 200 && code < 300:
		return true
	case code == http.StatusRequestTimeout, code == http.StatusConflict, code == http.StatusTooManyRequests:
		return false
	}
	return code >= 400 && code < 500
}

// recorder keeps an answer to store it before it is sent.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) WriteHeader(code int)        { r.code = code }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }

// drainBytes bounds what is read and dropped of a body over MaxBodyBytes
// before the 413 is sent: a client still sending when the connection
// closes would get a reset and lose the answer.
const drainBytes = 4 << 20

// readBody reads a command body within the body timeout: 413 past
// MaxBodyBytes (at once from Content-Length, before any 100 Continue),
// 408 past the timeout, else 400 on a read error.
func (a *api) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	tooLarge := func() ([]byte, bool) {
		w.Header().Set("Connection", "close")
		if !strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
			_, _ = io.CopyN(io.Discard, r.Body, drainBytes)
		}
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds %d bytes", MaxBodyBytes))
		return nil, false
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(a.bodyTimeout))
	if r.ContentLength > MaxBodyBytes {
		return tooLarge()
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if len(body) > MaxBodyBytes {
		return tooLarge()
	}
	// The deadline is for the body only: past it the server's background
	// read would end the request's context.
	_ = rc.SetReadDeadline(time.Time{})
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The rest of the body may still come: the connection is
			// not reused (the server would try to read the rest first).
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusRequestTimeout, fmt.Sprintf("request body not read within %s", a.bodyTimeout))
			return nil, false
		}
		writeError(w, http.StatusBadRequest, "reading request body: "+err.Error())
		return nil, false
	}
	return body, true
}

// committedAnswer is the answer a command's unit of work stores with its
// idempotency key (unitofwork.WithIdempotency): the command's answer
// without its follow-ups, which run after the commit, in the bytes
// writeJSON sends. Save replaces it with the full answer once the command
// returns, unless it was final (no follow-ups): the key holds the answer
// already, and saving it again would be one more round trip for nothing.
type committedAnswer struct {
	mu    sync.Mutex // build runs on the goroutine that commits, maybe a group's leader
	final []byte     // the body of the final answer stored, if one was
}

func (c *committedAnswer) build(id string, events []eventstore.Event, final bool) (idempotency.Answer, error) {
	b, err := encodeJSON(engine.CommandResult{ID: id, Events: engine.Appended(events)})
	if err != nil {
		return idempotency.Answer{}, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.final = nil
	if final {
		c.final = b
	}
	return idempotency.Answer{Status: http.StatusOK, Body: b}, nil
}

// is reports whether the answer sent (code, body) is the final answer the
// unit of work stored.
func (c *committedAnswer) is(code int, body []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.final != nil && code == http.StatusOK && bytes.Equal(c.final, body)
}
