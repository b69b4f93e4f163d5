package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os/exec"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Outcome is what the checks found, from outside: the event store and
// the outbox by SQL, the halt records in Redis, the projections over
// HTTP, against what the clients were told.
type Outcome struct {
	Accepted   int // 2xx answers
	Rejected   int // 4xx answers (each order is valid and new: none expected)
	Unresolved int // orders still unanswered when the load's bound passed
	Resends    int // requests sent again after a 5xx, an error or a timeout
	Replayed   int // 2xx answers marked Idempotent-Replayed

	LostStore      int // accepted, no OrderPlaced in the event store
	LostProjection int // accepted, missing from the client's order_ids, its partition not halted
	HeldByHalt     int // accepted, missing from order_ids behind a halted partition (pending in Redis, not lost yet)
	DupStore       int // extra OrderPlaced events of an order
	DupProjection  int // extra occurrences of an order in order_ids
	Reordered      int // orders that appear after an order accepted later
	Phantom        int // orders answered 4xx whose event was stored or projected
	Halted         int // partitions halted at any time: halt records at the end, or seen after a step
	HaltedAtEnd    int // halt records in Redis at the end
	haltKeys       []string
	Abandoned      int // outbox rows with status abandoned
	Outbox         map[string]int

	Complete      bool          // every projection held every accepted order
	CompleteAfter time.Duration // from the end of the last fault until then
	// AnsweredAfter is from the end of the last fault until every client
	// had its order in hand answered (a request sent during a fault may
	// wait out the client's 10 s timeout before it is resent); Answered
	// from then until the projections were complete.
	AnsweredAfter, CompleteAfterAnswered time.Duration
	Crashes                              int // host exits the harness did not cause

	Details []string // examples of each violation, for the reader
}

// Violations lists what broke a promise.
func (o Outcome) Violations() []string {
	var v []string
	add := func(n int, what string) {
		if n > 0 {
			v = append(v, fmt.Sprintf("%d %s", n, what))
		}
	}
	add(o.LostStore, "accepted orders missing from the event store")
	add(o.LostProjection, "accepted orders missing from their projection")
	add(o.HeldByHalt, "accepted orders held out of their projection by a halted partition")
	add(o.DupStore, "duplicated events in the event store")
	add(o.DupProjection, "duplicated orders in projections")
	add(o.Reordered, "orders projected out of acceptance order")
	add(o.Phantom, "orders answered 4xx but stored")
	add(o.Halted, "halted partitions (no poison message was injected)")
	add(o.Abandoned, "abandoned outbox rows")
	add(o.Unresolved, "orders never answered 2xx or 4xx")
	if !o.Complete {
		v = append(v, "projections incomplete at the end of the convergence wait")
	}
	return v
}

type projection struct {
	Orders   int      `json:"orders"`
	OrderIDs []string `json:"order_ids"`
}

// fetchProjection reads client's document from the first host that
// answers (404: no document yet).
func (r *runner) fetchProjection(ctx context.Context, client string) (projection, error) {
	var last error
	for i := range r.hosts {
		h := r.hosts[(r.rr+i)%len(r.hosts)]
		began := time.Now()
		code, b, err := h.get(ctx, "/v1/projections/client_orders/"+url.PathEscape(client))
		if took := time.Since(began); took > slowRead {
			// The convergence time includes this wait: say so, so that a
			// slow read is not taken for slow delivery.
			r.notef("projection read of %s from host %s took %s (status %d, error %v)", client, h.Addr, took.Round(time.Millisecond), code, err)
		}
		if err != nil {
			last = err
			continue
		}
		r.rr++
		switch code {
		case 200:
			var p projection
			if err := json.Unmarshal(b, &p); err != nil {
				return projection{}, fmt.Errorf("projection of %s: %w: %s", client, err, b)
			}
			return p, nil
		case 404:
			return projection{}, nil
		default:
			last = fmt.Errorf("projection of %s: %d %s", client, code, b)
		}
	}
	return projection{}, last
}

// slowRead is how long a projection read may take before the harness
// notes it.
const slowRead = time.Second

// converge waits, at most bound, until every client's projection holds
// every order it had accepted; it returns whether they did, and when. It
// keeps, for each order missing at its first look, when a look first
// found it in the projection (the laggards of the report).
func (r *runner) converge(ctx context.Context, clients []clientSnapshot, bound time.Duration) (bool, time.Time) {
	pending := map[string]map[string]bool{}
	for _, c := range clients {
		want := map[string]bool{}
		for _, id := range c.Accepted {
			want[id] = true
		}
		pending[c.ID] = want
	}
	r.arrived = map[string]time.Time{}
	first := true
	began, told := time.Now(), false
	err := until(ctx, bound, "every projection complete", func() (bool, string) {
		// Every client on every look, so that each laggard's arrival is
		// seen within one look.
		var short []string
		for id, want := range pending {
			p, err := r.fetchProjection(ctx, id)
			if err != nil {
				return false, err.Error()
			}
			now := time.Now()
			have := map[string]bool{}
			for _, o := range p.OrderIDs {
				have[o] = true
			}
			missing := 0
			for o := range want {
				seen, tracked := r.arrived[o]
				switch {
				case !have[o]:
					missing++
					if first {
						r.arrived[o] = time.Time{}
					}
				case tracked && seen.IsZero():
					r.arrived[o] = now
				}
			}
			if missing > 0 {
				short = append(short, fmt.Sprintf("client %s misses %d of %d accepted orders", id, missing, len(want)))
				continue
			}
			delete(pending, id)
		}
		first = false
		if len(short) > 0 && !told && time.Since(began) > slowConvergence {
			// Say what holds the outbox back while it does: that is when
			// the rows' state tells why.
			told = true
			r.notef("convergence slower than %s: %s", slowConvergence, strings.Join(short, "; "))
			for _, line := range r.outboxHeads(ctx) {
				r.notef("  %s", line)
			}
		}
		sort.Strings(short)
		return len(short) == 0, strings.Join(short, "; ")
	})
	if err != nil {
		r.notef("convergence: %v", err)
		return false, time.Now()
	}
	return true, time.Now()
}

// slowConvergence is how long convergence may take before the harness
// shows the outbox's state.
const slowConvergence = 5 * time.Second

// outboxHeads describes, per key with rows not yet published, its first
// such row and how many there are: the state that tells why the relay
// does not publish it.
func (r *runner) outboxHeads(ctx context.Context) []string {
	conn, err := r.sql(ctx)
	if err != nil {
		return []string{"outbox heads: " + err.Error()}
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT DISTINCT ON (ordering_key) ordering_key, id, status, retry_count,
			coalesce(locked_by, ''), coalesce(to_char(locked_until - now(), 'SS.MS'), '-'),
			coalesce(to_char(next_retry_at - now(), 'SS.MS'), '-'), coalesce(last_error->>'message', ''),
			count(*) OVER (PARTITION BY ordering_key)
		FROM outbox WHERE status <> 'published' ORDER BY ordering_key, id`)
	if err != nil {
		return []string{"outbox heads: " + err.Error()}
	}
	var out []string
	for rows.Next() {
		var key, status, owner, lock, retry, lastErr string
		var id int64
		var tries, n int
		if err := rows.Scan(&key, &id, &status, &tries, &owner, &lock, &retry, &lastErr, &n); err != nil {
			return append(out, "outbox heads: "+err.Error())
		}
		out = append(out, fmt.Sprintf("outbox key %s: %d unpublished, first row %d %s tries=%d locked_by=%q lock_left=%s retry_in=%s last_error=%q",
			key, n, id, status, tries, owner, lock, retry, lastErr))
	}
	if err := rows.Err(); err != nil {
		out = append(out, "outbox heads: "+err.Error())
	}
	if len(out) == 0 {
		out = append(out, "outbox: every row published")
	}
	return out
}

// Laggard is an order missing from its projection at the convergence
// wait's first look: when it was committed (the outbox row's
// created_at), published (published_at) and first seen projected, each
// from the end of the last fault. Zero durations are unknown.
type Laggard struct {
	Order, Key                      string
	Committed, Published, Projected time.Duration
}

// laggards reads the outbox rows of the orders converge tracked and
// returns the n that reached their projection last.
func (r *runner) laggards(ctx context.Context, lastFault time.Time, n int) ([]Laggard, error) {
	if len(r.arrived) == 0 {
		return nil, nil
	}
	ids := make([]string, 0, len(r.arrived))
	for id := range r.arrived {
		ids = append(ids, id)
	}
	conn, err := r.sql(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT data->>'order_id', coalesce(partition_key, ''), created_at, published_at
		FROM outbox WHERE type = 'OrderPlaced' AND data->>'order_id' = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	since := func(t time.Time) time.Duration {
		if t.IsZero() {
			return 0
		}
		return t.Sub(lastFault)
	}
	var out []Laggard
	for rows.Next() {
		var l Laggard
		var created time.Time
		var published *time.Time
		if err := rows.Scan(&l.Order, &l.Key, &created, &published); err != nil {
			return nil, err
		}
		l.Committed = since(created)
		if published != nil {
			l.Published = since(*published)
		}
		l.Projected = since(r.arrived[l.Order])
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Projected > out[j].Projected })
	return out[:min(n, len(out))], nil
}

// check measures everything once the run has converged (or given up).
func (r *runner) check(ctx context.Context, clients []clientSnapshot) (Outcome, error) {
	var o Outcome
	// A few examples of each kind of violation, not thousands of lines.
	shown := map[string]int{}
	detail := func(format string, args ...any) {
		kind := strings.SplitN(format, ":", 2)[0]
		if shown[kind]++; shown[kind] <= 5 {
			o.Details = append(o.Details, fmt.Sprintf(format, args...))
		}
	}
	stored, err := r.storedOrders(ctx)
	if err != nil {
		return o, err
	}
	halts, err := r.haltKeys(ctx)
	if err != nil {
		return o, err
	}
	haltedClient := map[string]bool{}
	for _, k := range halts {
		// client_orders:order:{client_id}:__halt__
		if f := strings.Split(k, ":"); len(f) == 4 && f[0] == "client_orders" && f[1] == "order" {
			haltedClient[f[2]] = true
		}
	}
	for _, c := range clients {
		o.Accepted += len(c.Accepted)
		o.Rejected += len(c.Rejected)
		o.Resends += c.Resends
		o.Replayed += c.Replayed
		if c.Unresolved != "" {
			o.Unresolved++
			detail("unresolved: order %s of %s never answered 2xx or 4xx", c.Unresolved, c.ID)
		}
		accepted := map[string]int{} // order id -> acceptance index
		for i, id := range c.Accepted {
			accepted[id] = i
			switch n := stored[id]; {
			case n == 0:
				o.LostStore++
				detail("lost (event store): %s of %s", id, c.ID)
			case n > 1:
				o.DupStore += n - 1
				detail("duplicated (event store): %s of %s, %d events", id, c.ID, n)
			}
		}
		p, err := r.fetchProjection(ctx, c.ID)
		if err != nil {
			return o, err
		}
		seen := map[string]int{}
		maxIndex := -1
		for _, id := range p.OrderIDs {
			seen[id]++
			if seen[id] > 1 {
				o.DupProjection++
				detail("duplicated (projection): %s in client_orders/%s", id, c.ID)
				continue
			}
			i, ok := accepted[id]
			if !ok {
				continue // a rejected order (phantom, below) or an unresolved one
			}
			if i < maxIndex {
				o.Reordered++
				detail("reordered: %s (accepted #%d) after #%d in client_orders/%s", id, i+1, maxIndex+1, c.ID)
			}
			maxIndex = max(maxIndex, i)
		}
		var missing []string
		for _, id := range c.Accepted {
			if seen[id] == 0 {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 && haltedClient[c.ID] {
			o.HeldByHalt += len(missing)
			detail("held by a halt: client_orders/%s misses %d of its %d accepted orders (the first: %s, accepted #%d), its partition halted",
				c.ID, len(missing), len(c.Accepted), missing[0], accepted[missing[0]]+1)
		} else if len(missing) > 0 {
			o.LostProjection += len(missing)
			detail("lost (projection): client_orders/%s misses %d of its %d accepted orders (the first: %s, accepted #%d); it holds %d",
				c.ID, len(missing), len(c.Accepted), missing[0], accepted[missing[0]]+1, len(p.OrderIDs))
		}
		for id, answer := range c.Rejected {
			if stored[id] > 0 || seen[id] > 0 {
				o.Phantom++
				detail("phantom: %s of %s answered %s, yet %d event(s) stored, %d in the projection", id, c.ID, answer, stored[id], seen[id])
			} else {
				detail("rejected: %s of %s: %s", id, c.ID, answer)
			}
		}
	}
	if o.Outbox, err = r.outboxCounts(ctx); err != nil {
		return o, err
	}
	o.Abandoned = o.Outbox["abandoned"]
	o.HaltedAtEnd, o.Halted, o.haltKeys = len(halts), len(halts), halts
	for _, k := range halts {
		detail("halt record: %s", k)
	}
	for _, h := range r.hosts {
		o.Crashes += h.Crashes()
	}
	return o, nil
}

// storedOrders counts OrderPlaced events per order id, straight from the
// event store's table.
func (r *runner) storedOrders(ctx context.Context) (map[string]int, error) {
	conn, err := r.sql(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT data->>'order_id', count(*) FROM message_store.messages
		WHERE type = 'OrderPlaced' GROUP BY 1`)
	if err != nil {
		return nil, fmt.Errorf("event store: %w", err)
	}
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, rows.Err()
}

func (r *runner) outboxCounts(ctx context.Context) (map[string]int, error) {
	conn, err := r.sql(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT status, count(*) FROM outbox GROUP BY 1`)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		out[s] = n
	}
	return out, rows.Err()
}

// sql connects to PostgreSQL directly, not through a proxy.
func (r *runner) sql(ctx context.Context) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return pgx.Connect(cctx, URL(r.pg.Addr()))
}

// haltKeys are the durable halt records ({group}:{unit}:__halt__) in
// Redis, read directly.
func (r *runner) haltKeys(ctx context.Context) ([]string, error) {
	c := redis.NewClient(&redis.Options{Addr: r.redis.Addr()})
	defer c.Close()
	var keys []string
	iter := c.Scan(ctx, 0, "*:__halt__", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	sort.Strings(keys)
	return keys, iter.Err()
}

// cli runs an operator command of the host binary against host 0's
// config and returns its output.
func (r *runner) cli(ctx context.Context, args ...string) string {
	cctx, cancel := context.WithTimeout(ctx, serverBound)
	defer cancel()
	cmd := exec.CommandContext(cctx, r.o.Bin, append(args, "--config", r.hosts[0].cfg)...)
	cmd.Env = hostEnv()
	out, err := cmd.CombinedOutput()
	s := strings.TrimRight(string(out), "\n")
	if err != nil {
		s += fmt.Sprintf("\n(%s: %v)", strings.Join(args, " "), err)
	}
	return s
}
