package chaos

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// Client is one load client: its own client_id, one PlaceOrder at a time,
// the next only after the previous one was answered for good (2xx or
// 4xx), so its acceptance order is defined. A 5xx, a connection error or
// a timeout is resent with the same Idempotency-Key, to any host.
type Client struct {
	ID string

	rng   *rand.Rand
	hosts []string
	http  *http.Client

	mu         sync.Mutex
	accepted   []string          // order ids, in acceptance order
	rejected   map[string]string // order id -> the 4xx answer
	unresolved string            // the order in hand when the client gave up
	attempts   int
	resends    int
	replayed   int
}

// clientSnapshot is a client's record at one moment.
type clientSnapshot struct {
	ID         string
	Accepted   []string
	Rejected   map[string]string
	Unresolved string
	Attempts   int
	Resends    int
	Replayed   int
}

func newClient(id string, seed uint64, hosts []string) *Client {
	return &Client{
		ID: id, rng: rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)), hosts: hosts,
		// Its own connections: a cut host's dead keep-alives are its own.
		http:     &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}},
		rejected: map[string]string{},
	}
}

// run places orders until stop is closed, then finishes the order in
// hand; it gives that one up only when ctx ends (the harness's bound).
func (c *Client) run(ctx context.Context, stop <-chan struct{}, pace time.Duration) {
	defer c.http.CloseIdleConnections()
	for n := 1; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		id := fmt.Sprintf("%s-o%d", c.ID, n)
		if !c.place(ctx, id) {
			c.mu.Lock()
			c.unresolved = id
			c.mu.Unlock()
			return
		}
		if pace > 0 {
			hold(ctx, pace)
		}
	}
}

// place sends one order until it is answered for good; false if ctx
// ended first.
func (c *Client) place(ctx context.Context, id string) bool {
	body := fmt.Sprintf(`{"order_id":%q,"client_id":%q,"total":1}`, id, c.ID)
	backoff := 50 * time.Millisecond
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil {
			return false
		}
		host := c.hosts[c.rng.IntN(len(c.hosts))]
		code, answer, replayed, err := c.post(ctx, host, id, body)
		c.mu.Lock()
		c.attempts++
		if attempt > 0 {
			c.resends++
		}
		switch {
		case err == nil && code >= 200 && code < 300:
			c.accepted = append(c.accepted, id)
			if replayed {
				c.replayed++
			}
			c.mu.Unlock()
			return true
		case err == nil && code >= 400 && code < 500:
			c.rejected[id] = fmt.Sprintf("%d %s", code, answer)
			c.mu.Unlock()
			return true
		}
		c.mu.Unlock()
		hold(ctx, backoff/2+time.Duration(c.rng.Int64N(int64(backoff))))
		backoff = min(2*backoff, time.Second)
	}
}

func (c *Client) post(ctx context.Context, host, key, body string) (code int, answer string, replayed bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+host+"/v1/commands/PlaceOrder", bytes.NewBufferString(body))
	if err != nil {
		return 0, "", false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, "", false, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return 0, "", false, err // an answer cut short is no answer
	}
	return resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed") == "true", nil
}

func (c *Client) snapshot() clientSnapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	rej := make(map[string]string, len(c.rejected))
	for k, v := range c.rejected {
		rej[k] = v
	}
	return clientSnapshot{ID: c.ID, Accepted: append([]string(nil), c.accepted...), Rejected: rej,
		Unresolved: c.unresolved, Attempts: c.attempts, Resends: c.resends, Replayed: c.replayed}
}

// Load is the set of clients, started together and stopped together.
type Load struct {
	clients []*Client
	stop    chan struct{}
	wg      sync.WaitGroup
	cancel  context.CancelFunc
}

// StartLoad starts n clients against hosts (HTTP addresses).
func StartLoad(ctx context.Context, seed uint64, n int, hosts []string, pace time.Duration) *Load {
	ctx, cancel := context.WithCancel(ctx)
	l := &Load{stop: make(chan struct{}), cancel: cancel}
	for i := range n {
		c := newClient(fmt.Sprintf("c%d", i+1), seed*1000+uint64(i), hosts)
		l.clients = append(l.clients, c)
		l.wg.Add(1)
		go func() { defer l.wg.Done(); c.run(ctx, l.stop, pace) }()
	}
	return l
}

// Stop asks every client to stop after the order in hand and waits, at
// most bound, for each to have it answered; a client still resending
// then gives up, its order unresolved. Safe to call more than once.
func (l *Load) Stop(bound time.Duration) {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(bound):
		l.cancel()
		<-done
	}
	l.cancel()
}

// Accepted is how many orders have been accepted so far.
func (l *Load) Accepted() int {
	n := 0
	for _, c := range l.clients {
		c.mu.Lock()
		n += len(c.accepted)
		c.mu.Unlock()
	}
	return n
}

func (l *Load) snapshots() []clientSnapshot {
	out := make([]clientSnapshot, len(l.clients))
	for i, c := range l.clients {
		out[i] = c.snapshot()
	}
	return out
}
