package redispartition

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Wake is one read of a category's wake-up stream (WakeKey): the partition
// keys published to since the last read.
type Wake struct {
	Category string
	Keys     []string
	// Released are keys whose units a host handed over (Leases.Released):
	// free now, to be acquired even if seen held.
	Released []string
	// At is, per key of Keys, the id of the wake-up entry that named it
	// (the last one, when several did).
	At map[string]string
}

// releasedValue marks a released key's field in a wake-up entry; a
// publish writes "1".
const releasedValue = "r"

// wakeChunk is the most keys one handover entry names.
const wakeChunk = 1000

// Released tells the consumers of category that the units of keys were
// released for another host to take (a fair-share handover): one wake-up
// entry per wakeChunk keys.
func (s *Leases) Released(ctx context.Context, category string, keys []string) error {
	for from := 0; from < len(keys); from += wakeChunk {
		chunk := keys[from:min(from+wakeChunk, len(keys))]
		vals := make([]string, 0, 2*len(chunk))
		for _, k := range chunk {
			vals = append(vals, k, releasedValue)
		}
		err := s.rdb.XAdd(ctx, &redis.XAddArgs{Stream: s.key(WakeKey(category)), MaxLen: WakeMaxLen, Approx: true, Values: vals}).Err()
		if err != nil {
			return fmt.Errorf("partition: announce %d released keys of %s: %w", len(keys), category, err)
		}
	}
	return nil
}

// Listener reads the wake-up streams of categories, blocking, on a Redis
// connection of its own, so that Interrupt can end a blocked read at once
// (CLIENT UNBLOCK). Over a client without dedicated connections (a
// cluster client) its reads block on the pool and Interrupt does nothing:
// a read then returns within its block time. One goroutine reads; any
// goroutine may Interrupt.
type Listener struct {
	s  *Leases
	mu sync.Mutex
	// conn is the listener's connection and id its CLIENT ID, set on the
	// first read and again after a failed one; own is the client conn
	// belongs to.
	conn *redis.Conn
	own  *redis.Client
	id   int64
}

// Listen returns a listener on the wake-up streams. Close it.
func (s *Leases) Listen() *Listener { return &Listener{s: s} }

// WakeTail returns the id of the last entry of category's wake-up stream,
// "0-0" if it has none: where a listener that starts now reads from.
func (s *Leases) WakeTail(ctx context.Context, category string) (string, error) {
	res, err := s.rdb.XRevRangeN(ctx, s.key(WakeKey(category)), "+", "-", 1).Result()
	if err != nil {
		return "", fmt.Errorf("partition: wake-up stream of %s: %w", category, err)
	}
	if len(res) == 0 {
		return "0-0", nil
	}
	return res[0].ID, nil
}

// Read waits up to block for entries after cursors[category] in the
// wake-up streams of the categories of cursors, reads at most count per
// stream, and moves the cursors past them. behind reports a stream that
// may have dropped entries this listener had not read (XADD MAXLEN trims
// the oldest): its wake-ups are lost, and the caller must assume every key
// was published to. It returns no wakes and no error when block passes
// with nothing new.
func (l *Listener) Read(ctx context.Context, cursors map[string]string, block time.Duration, count int) (wakes []Wake, behind bool, err error) {
	if len(cursors) == 0 {
		select {
		case <-ctx.Done():
		case <-time.After(block):
		}
		return nil, false, nil
	}
	cats := make([]string, 0, len(cursors))
	args := make([]string, 0, 2*len(cursors))
	for cat := range cursors {
		cats = append(cats, cat)
		args = append(args, l.s.key(WakeKey(cat)))
	}
	for _, cat := range cats {
		args = append(args, cursors[cat])
	}
	cmd, err := l.open(ctx)
	if err != nil {
		return nil, false, err
	}
	res, err := cmd.XRead(ctx, &redis.XReadArgs{Streams: args, Count: int64(count), Block: block}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		l.reset()
		return nil, false, fmt.Errorf("partition: read the wake-up streams: %w", err)
	}
	byKey := make(map[string]string, len(cats))
	for _, cat := range cats {
		byKey[l.s.key(WakeKey(cat))] = cat
	}
	for _, st := range res {
		cat, ok := byKey[st.Stream]
		if !ok || len(st.Messages) == 0 {
			continue
		}
		from := cursors[cat]
		w := Wake{Category: cat, At: map[string]string{}}
		for _, m := range st.Messages {
			for k, v := range m.Values {
				if v == releasedValue {
					w.Released = append(w.Released, k)
				} else {
					w.Keys = append(w.Keys, k)
					w.At[k] = m.ID
				}
			}
		}
		cursors[cat] = st.Messages[len(st.Messages)-1].ID
		wakes = append(wakes, w)
		if len(st.Messages) == count {
			// Behind by a whole read: check that the trim has not passed
			// the cursor this read started from.
			first, err := l.s.rdb.XRangeN(ctx, st.Stream, "-", "+", 1).Result()
			if err != nil {
				return wakes, true, nil
			}
			if len(first) > 0 && idAfter(first[0].ID, from) {
				behind = true
			}
		}
	}
	return wakes, behind, nil
}

// open returns the listener's connection, opening it (and reading its
// CLIENT ID) if it has none; over a client without dedicated connections
// it returns the client itself.
func (l *Listener) open(ctx context.Context) (redis.Cmdable, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		return l.conn, nil
	}
	cl, ok := l.s.rdb.(*redis.Client)
	if !ok {
		return l.s.rdb, nil
	}
	// A client of its own, as Leases.Dedicated: a Conn shares its client's
	// options, and both write its maintenance notifications mode as their
	// connections negotiate (initConn), each under a lock of its own, a
	// data race with the shared client's connections (-race in CI).
	o := *cl.Options()
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns = 1, 0, 1
	o.PushNotificationProcessor, o.MaintNotificationsConfig = nil, nil
	own := redis.NewClient(&o)
	conn := own.Conn()
	id, err := conn.ClientID(ctx).Result()
	if err != nil {
		_ = conn.Close()
		_ = own.Close()
		return nil, fmt.Errorf("partition: open the wake-up listener: %w", err)
	}
	l.conn, l.own, l.id = conn, own, id
	return conn, nil
}

// reset drops the connection after a failed read: the next read opens a
// new one (a broken connection may have been replaced under a new id).
func (l *Listener) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		_ = l.conn.Close()
		_ = l.own.Close()
		l.conn, l.own, l.id = nil, nil, 0
	}
}

// Interrupt ends a read blocked on the listener's connection now (CLIENT
// UNBLOCK, as if its block time had passed); the read returns nothing. It does nothing when no read is
// blocked, so a caller that must end a read retries until it has.
func (l *Listener) Interrupt(ctx context.Context) {
	l.mu.Lock()
	id := l.id
	l.mu.Unlock()
	if id != 0 {
		_ = l.s.rdb.ClientUnblock(ctx, id).Err()
	}
}

// Close closes the listener's connection.
func (l *Listener) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return nil
	}
	err := errors.Join(l.conn.Close(), l.own.Close())
	l.conn, l.own, l.id = nil, nil, 0
	return err
}

// idAfter reports whether stream entry id a is after b ("ms-seq" each).
func idAfter(a, b string) bool {
	am, as := splitID(a)
	bm, bs := splitID(b)
	return am > bm || (am == bm && as > bs)
}

func splitID(id string) (uint64, uint64) {
	ms, seq, _ := strings.Cut(id, "-")
	m, _ := strconv.ParseUint(ms, 10, 64)
	s, _ := strconv.ParseUint(seq, 10, 64)
	return m, s
}

// wakeCount is the most entries of one wake-up stream a listener reads at
// once (each names the keys of one publish call).
const wakeCount = 512

// listen blocks on the wake-up streams of the subscribed categories and,
// for each key published to, wakes the unit's worker here, or tries to
// acquire the unit when no worker here has it: a key never seen before
// starts within a round trip of its first publish, not at the next
// discovery pass. After a failed read, or a read that found the stream
// trimmed past its cursor, wake-ups may have been missed, and every
// worker reads its streams again. It returns when the consumer stops.
func (c *Consumer) listen(l *Listener, cursors map[string]string) {
	ctx := c.soft
	failures := 0
	for ctx.Err() == nil {
		err := c.follow(ctx, cursors)
		var wakes []Wake
		behind := false
		if err == nil {
			wakes, behind, err = l.Read(ctx, cursors, c.opts.Heartbeat, wakeCount)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			c.leaseOutage.Fail(fmt.Errorf("wake-ups: %w", err), "failures", failures)
			select {
			case <-ctx.Done():
				return
			case <-c.opts.Clock.After(c.opts.Retry.InfraPause(failures)):
			}
			continue
		}
		if failures > 0 || behind {
			// New keys may have been missed too: the next discovery pass
			// walks the indexes whole.
			failures = 0
			c.mu.Lock()
			c.rescan = true
			c.mu.Unlock()
			c.wakeAll()
		}
		c.woken(ctx, wakes)
	}
}

// follow keeps cursors on the categories of the current subscriptions: a
// category new to them starts at its stream's tail (what its index held
// before is found by discovery), one no longer subscribed is dropped. A
// category added by a reload between two discovery passes may have keys
// published after one pass read its index and before its tail was read
// here: the next pass finds them.
func (c *Consumer) follow(ctx context.Context, cursors map[string]string) error {
	want := map[string]bool{}
	for _, s := range c.opts.Subscriptions() {
		for _, cat := range s.Categories {
			want[cat] = true
		}
	}
	for cat := range cursors {
		if !want[cat] {
			delete(cursors, cat)
		}
	}
	for cat := range want {
		if _, ok := cursors[cat]; ok {
			continue
		}
		id, err := c.ctl.WakeTail(ctx, cat)
		if err != nil {
			return err
		}
		cursors[cat] = id
	}
	return nil
}

// woken places the units of the keys published to: their workers here
// read again; the others are acquired if free. The units of released keys
// (a handover) are tried even if seen held.
func (c *Consumer) woken(ctx context.Context, wakes []Wake) {
	if len(wakes) == 0 {
		return
	}
	keys, released := map[string][]string{}, map[string][]string{}
	at := map[string]map[string]string{} // category → key → wake-up entry
	for _, w := range wakes {
		if at[w.Category] == nil {
			at[w.Category] = map[string]string{}
		}
		for k, id := range w.At {
			at[w.Category][k] = id
		}
		keys[w.Category] = append(keys[w.Category], w.Keys...)
		keys[w.Category] = append(keys[w.Category], w.Released...)
		released[w.Category] = append(released[w.Category], w.Released...)
	}
	for cat, ks := range keys {
		slices.Sort(ks)
		keys[cat] = slices.Compact(ks)
	}
	for _, s := range c.opts.Subscriptions() {
		units := buildUnits(s, keys)
		handed := map[string]bool{}
		c.mu.Lock()
		for _, u := range buildUnits(s, released) {
			delete(c.held, unitID{s.Group, u.unit})
			handed[u.unit] = true
		}
		// The group's unit count grows by the units seen for the first
		// time (a key never published before), not by every unit woken:
		// a released unit, or one a publish woke that is owned, held or
		// counted by an earlier wake-up, is counted already, and counting
		// it again would raise the share and let a host take back what it
		// just handed over. The count stays raised until the next
		// discovery pass counts the index again: a count kept only for
		// this wake-up left each later new key's share where the pass put
		// it, so once every host was at that share a new key waited for
		// the next pass (a p99 of over a second with 3 hosts).
		fresh := c.fresh[s.Group]
		for _, u := range units {
			id := unitID{s.Group, u.unit}
			_, held := c.held[id]
			if _, counted := fresh[u.unit]; handed[u.unit] || c.owned[id] != nil || held || counted {
				continue
			}
			var w wokenAt
			for _, cat := range u.cat {
				if id := at[cat][u.key]; id != "" {
					w = wokenAt{cat, id}
				}
			}
			// A wake-up read after the last count of the index, for a
			// publish before it: counted by it already.
			if tail, ok := c.counted[s.Group][w.cat]; ok && w.id != "" && !idAfter(w.id, tail) {
				continue
			}
			if fresh == nil {
				fresh = map[string]wokenAt{}
				c.fresh[s.Group] = fresh
			}
			fresh[u.unit] = w
			c.total[s.Group]++
		}
		total := c.total[s.Group]
		c.mu.Unlock()
		if _, err := c.place(ctx, s, units, total, true, false); err != nil && ctx.Err() == nil {
			c.leaseOutage.Fail(fmt.Errorf("acquire on wake-up: %w", err), "group", s.Group)
		}
	}
}

// wakeAll wakes every worker here: wake-ups may have been missed.
func (c *Consumer) wakeAll() {
	for _, w := range c.workers() {
		w.signal()
	}
}

// stopListening ends the listener's blocked read and waits for listen to
// return; done is closed when it has.
func (c *Consumer) stopListening(l *Listener, done <-chan struct{}) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		l.Interrupt(ctx)
		cancel()
		select {
		case <-done:
			_ = l.Close()
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}
