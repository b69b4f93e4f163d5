package chaos

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Kind is a kind of fault.
type Kind string

// The faults. A target "owner" is the host owning the most partitions
// when the fault starts.
const (
	HostKill       Kind = "host-kill"             // kill -9 of an owner, restarted after 0.2-3 s
	HostStop       Kind = "host-stop"             // SIGSTOP of an owner past the lease TTL, then SIGCONT
	RollingRestart Kind = "rolling-restart"       // every host in turn: SIGTERM, start, healthy
	HotReload      Kind = "hot-reload"            // a new client_orders.wasm in every host's plugins dir, SIGHUP
	RedisKill      Kind = "redis-kill"            // kill -9 of Redis, restarted after 0.2-3 s (AOF kept)
	RedisShutdown  Kind = "redis-shutdown-nosave" // SHUTDOWN NOSAVE, restarted after 0.2-3 s (AOF kept)
	RedisEmpty     Kind = "redis-restart-empty"   // kill -9, AOF and RDB deleted, restarted empty
	PGFast         Kind = "pg-restart-fast"       // pg_ctl restart -m fast
	PGImmediate    Kind = "pg-restart-immediate"  // pg_ctl restart -m immediate (crash recovery)
	CutPG          Kind = "cut-pg"                // connections to PostgreSQL reset and refused for 1-10 s
	CutRedis       Kind = "cut-redis"             // connections to Redis reset and refused for 1-10 s
	StallPGUp      Kind = "stall-pg-up"           // bytes host -> PostgreSQL held for 1-10 s
	StallPGDown    Kind = "stall-pg-down"         // bytes PostgreSQL -> host held for 1-10 s
	StallRedisUp   Kind = "stall-redis-up"        // bytes host -> Redis held for 1-10 s
	StallRedisDown Kind = "stall-redis-down"      // bytes Redis -> host held for 1-10 s
	RedisDown      Kind = "redis-down"            // kill -9 of Redis, restarted after -outage-redis (60 s; AOF kept)
	PGDown         Kind = "pg-down"               // pg_ctl stop -m fast, started after -outage-pg (30 s)
)

// Kinds lists every fault, in the order the report prints them.
var Kinds = []Kind{HostKill, HostStop, RollingRestart, HotReload, RedisKill, RedisShutdown, RedisEmpty,
	PGFast, PGImmediate, CutPG, CutRedis, StallPGUp, StallPGDown, StallRedisUp, StallRedisDown, RedisDown, PGDown}

// long says whether a kind is a long outage: it runs alone, never mixed.
func (k Kind) long() bool { return k == RedisDown || k == PGDown }

// target is what a fault acts on; two faults of one step never share one.
func (k Kind) target() string {
	switch k {
	case HostKill, HostStop, RollingRestart, HotReload:
		return "hosts"
	case RedisKill, RedisShutdown, RedisEmpty, CutRedis, StallRedisUp, StallRedisDown, RedisDown:
		return "redis"
	}
	return "postgres"
}

// ParseKinds reads a comma-separated list of kinds; "" is every kind.
func ParseKinds(s string) ([]Kind, error) {
	if strings.TrimSpace(s) == "" {
		return Kinds, nil
	}
	var out []Kind
	for _, f := range strings.Split(s, ",") {
		k := Kind(strings.TrimSpace(f))
		found := false
		for _, known := range Kinds {
			found = found || known == k
		}
		if !found {
			return nil, fmt.Errorf("unknown fault kind %q (known: %v)", k, Kinds)
		}
		out = append(out, k)
	}
	return out, nil
}

// Fault is one fault with its parameters, fixed by the schedule.
type Fault struct {
	Kind  Kind
	Hold  time.Duration // how long the fault lasts (a cut, a stall, a stop, the pause before a restart)
	Hosts []int         // for cuts and stalls: the hosts whose proxies act; nil for all
}

func (f Fault) String() string {
	s := fmt.Sprintf("%s hold=%s", f.Kind, f.Hold.Round(10*time.Millisecond))
	if f.Kind.target() != "hosts" && (strings.HasPrefix(string(f.Kind), "cut-") || strings.HasPrefix(string(f.Kind), "stall-")) {
		if f.Hosts == nil {
			s += " hosts=all"
		} else {
			s += fmt.Sprintf(" hosts=%v", f.Hosts)
		}
	}
	return s
}

// Step is one or more faults at once (mixed), after Gap of load alone.
type Step struct {
	Gap    time.Duration
	Faults []Fault
}

// Plan derives the schedule from seed: steps steps, each kind of kinds
// alone once first (in an order the seed shuffles), then mixes of two
// kinds on different targets (never a long outage). With fewer steps than
// kinds, the first steps of the shuffle. A long outage's hold is the
// run's (Options.RedisOutage, PGOutage), set by outages.
func Plan(seed uint64, steps, hosts int, ttl time.Duration, kinds []Kind) []Step {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	order := append([]Kind(nil), kinds...)
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	var plan []Step
	for i := 0; i < steps; i++ {
		st := Step{Gap: time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))}
		if i < len(order) {
			st.Faults = []Fault{fault(rng, order[i], hosts, ttl)}
		} else {
			var short []Kind
			for _, k := range order {
				if !k.long() {
					short = append(short, k)
				}
			}
			if len(short) == 0 {
				short = order
			}
			a := short[rng.IntN(len(short))]
			st.Faults = []Fault{fault(rng, a, hosts, ttl)}
			var others []Kind
			for _, k := range short {
				if k.target() != a.target() {
					others = append(others, k)
				}
			}
			if len(others) > 0 {
				st.Faults = append(st.Faults, fault(rng, others[rng.IntN(len(others))], hosts, ttl))
			}
		}
		plan = append(plan, st)
	}
	return plan
}

func fault(rng *rand.Rand, k Kind, hosts int, ttl time.Duration) Fault {
	f := Fault{Kind: k}
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo))) }
	switch k {
	case HostStop:
		f.Hold = ttl + between(500*time.Millisecond, 3*time.Second)
	case HostKill, RedisKill, RedisShutdown, RedisEmpty:
		f.Hold = between(200*time.Millisecond, 3*time.Second)
	case RedisDown, PGDown:
		// Held for the run's outage (outages), not drawn.
	case CutPG, CutRedis, StallPGUp, StallPGDown, StallRedisUp, StallRedisDown:
		f.Hold = between(time.Second, 10*time.Second)
		if rng.IntN(2) == 0 {
			f.Hosts = []int{rng.IntN(hosts)}
		}
	}
	return f
}

// outages sets the hold of every long outage of plan: redis for
// redis-down, pg for pg-down.
func outages(plan []Step, redis, pg time.Duration) {
	for i := range plan {
		for j := range plan[i].Faults {
			switch plan[i].Faults[j].Kind {
			case RedisDown:
				plan[i].Faults[j].Hold = redis
			case PGDown:
				plan[i].Faults[j].Hold = pg
			}
		}
	}
}
