// Command behave is a test module whose handler does what each message's
// "op" says: succeed, fail in each error kind, spin forever or until the
// host says so, exhaust memory,
// overflow its stack, write oversized output, or use the host functions.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/proteanhq/protean-host/pdk"
)

type Op struct {
	Op  string `json:"op"`
	ID  string `json:"id"`
	Arg string `json:"arg,omitempty"`
}

type doc struct {
	Seen []string `json:"seen"`
}

var sink []byte

func recurse(n int) int { return recurse(n+1) + 1 }

// Increment adds one to a counter aggregate: a read-modify-write that
// loses updates unless optimistic concurrency holds.
type Increment struct {
	ID string `json:"id"`
}

type Incremented struct {
	ID string `json:"id"`
	N  int    `json:"n"`
}

type counter struct {
	N int `json:"n"`
}

// Slow loads aggregate slow/ID (so a test sees it start), then spins for
// MS milliseconds of wall time; with Until, it then spins until aggregate
// slow/Until exists (a guest a test holds in flight, whose only way out is
// the host's answer: it never looks at a deadline).
type Slow struct {
	ID    string `json:"id"`
	MS    int    `json:"ms"`
	Until string `json:"until,omitempty"`
}

type Fill struct {
	ID   string `json:"id"`
	N    int    `json:"n"`
	Size int    `json:"size"`
}

type Padded struct {
	Pad string `json:"pad"`
}

func init() {
	pdk.Module("behave", "1.0.0")
	pdk.Command[Slow]("Slow", "slow")
	pdk.Event[Slow]("SlowDone", "slow")
	pdk.On(pdk.CommandHandler("slow", "slow"), "Slow", func(ctx *pdk.Context, cmd Slow) error {
		var v struct{}
		if _, err := ctx.Load(pdk.Aggregate, "slow", cmd.ID, &v); err != nil {
			return err
		}
		for end := time.Now().Add(time.Duration(cmd.MS) * time.Millisecond); time.Now().Before(end); {
		}
		for cmd.Until != "" {
			n, err := ctx.Load(pdk.Aggregate, "slow", cmd.Until, &v)
			if err != nil {
				return err
			}
			if n > 0 {
				break
			}
		}
		return ctx.Emit("slow-"+cmd.ID, "SlowDone", cmd)
	})
	pdk.Command[Increment]("Increment", "counter")
	pdk.Event[Incremented]("Incremented", "counter")
	pdk.On(pdk.CommandHandler("counter", "counter"), "Increment", func(ctx *pdk.Context, cmd Increment) error {
		var c counter
		v, err := ctx.Load(pdk.Aggregate, "counter", cmd.ID, &c)
		if err != nil {
			return err
		}
		c.N++
		if err := ctx.Save(pdk.Aggregate, "counter", cmd.ID, v, c); err != nil {
			return err
		}
		return ctx.Emit("counter-"+cmd.ID, "Incremented", Incremented{ID: cmd.ID, N: c.N})
	})
	// Again counts itself on aggregate again/ID and dispatches itself
	// again: a follow-up chain with no end of its own.
	pdk.Command[Increment]("Again", "again")
	pdk.On(pdk.CommandHandler("again", "again"), "Again", func(ctx *pdk.Context, cmd Increment) error {
		var c counter
		v, err := ctx.Load(pdk.Aggregate, "again", cmd.ID, &c)
		if err != nil {
			return err
		}
		c.N++
		if err := ctx.Save(pdk.Aggregate, "again", cmd.ID, v, c); err != nil {
			return err
		}
		return ctx.Dispatch("Again", cmd)
	})
	// Fill appends N events of Size bytes each to stream pad-ID: a tenant
	// filling its own stream, for the read floods.
	pdk.Command[Fill]("Fill", "pad")
	pdk.Event[Padded]("Padded", "pad")
	pdk.On(pdk.CommandHandler("fill", "pad"), "Fill", func(ctx *pdk.Context, f Fill) error {
		for range f.N {
			if err := ctx.Emit("pad-"+f.ID, "Padded", Padded{Pad: strings.Repeat("x", f.Size)}); err != nil {
				return err
			}
		}
		return nil
	})
	pdk.Event[Op]("Op", "ops")
	// EmitOp appends its Op as an event, so a process-level test can put
	// an op in front of the event handler.
	pdk.Command[Op]("EmitOp", "ops")
	pdk.On(pdk.CommandHandler("emit_op", "ops"), "EmitOp", func(ctx *pdk.Context, m Op) error {
		return ctx.Emit("ops-"+m.ID, "Op", m)
	})
	pdk.On(pdk.EventHandler("behave", "ops"), "Op", func(ctx *pdk.Context, m Op) error {
		switch m.Op {
		case "ok":
		case "transient":
			return pdk.Transient(errors.New("try again"))
		case "rejected":
			return pdk.Rejected("no")
		case "panic":
			panic("handler panic")
		case "loop":
			for {
				sink = append(sink[:0], 1)
			}
		case "load_loop": // load aggregate ops/Arg (so a test sees it start), then loop without the host
			var d doc
			if _, err := ctx.Load(pdk.Aggregate, "ops", m.Arg, &d); err != nil {
				return err
			}
			for {
				sink = append(sink[:0], 1)
			}
		case "spin": // until aggregate ops/Arg exists (see Slow.Until)
			for {
				var d doc
				n, err := ctx.Load(pdk.Aggregate, "ops", m.Arg, &d)
				if err != nil {
					return err
				}
				if n > 0 {
					return nil
				}
			}
		case "rand": // crypto/rand, as a guest would seed keys or ids
			b := make([]byte, 16)
			if _, err := rand.Read(b); err != nil {
				return err
			}
			return ctx.Save(pdk.Projection, "behave", m.ID, 0, map[string]string{"rand": hex.EncodeToString(b)})
		case "exit0": // WASI proc_exit(0) in the middle of a call
			os.Exit(0)
		case "log": // Arg lines of guest log
			n, _ := strconv.Atoi(m.Arg)
			for i := 0; i < n; i++ {
				ctx.Log("info", "behave says hello")
			}
		case "grow": // hold Arg MiB for the rest of the instance's life
			n, _ := strconv.Atoi(m.Arg)
			sink = append(sink, make([]byte, n<<20)...)
		case "escape": // files, directories, environment, network: what the sandbox gives
			got := map[string]string{}
			if b, err := os.ReadFile("/etc/hostname"); err == nil {
				got["file"] = string(b)
			}
			if es, err := os.ReadDir("/"); err == nil && len(es) > 0 {
				got["dir"] = es[0].Name()
			}
			if len(os.Environ()) > 0 {
				got["env"] = strings.Join(os.Environ(), ",")
			}
			if c, err := net.Dial("tcp", "127.0.0.1:80"); err == nil {
				got["net"] = c.RemoteAddr().String()
			}
			return ctx.Save(pdk.Projection, "behave", m.ID, 0, got)
		case "sinklen": // what "grow" left in this instance
			return ctx.Save(pdk.Projection, "behave", m.ID, 0, map[string]int{"sink": len(sink)})
		case "oom":
			for {
				sink = append(sink, make([]byte, 16<<20)...)
			}
		case "stack":
			return errors.New(string(rune(recurse(0))))
		case "big":
			return ctx.Save(pdk.Projection, "behave", m.ID, 0, map[string]string{"pad": strings.Repeat("x", 3<<20)})
		case "load":
			var d doc
			v, err := ctx.Load(pdk.Projection, "behave", m.ID, &d)
			if err != nil {
				return err
			}
			d.Seen = append(d.Seen, m.Arg)
			return ctx.Save(pdk.Projection, "behave", m.ID, v, d)
		case "foreign": // another module's projection: outside this module's scope
			return ctx.Save(pdk.Projection, "client_orders", m.ID, 0, map[string]int{"orders": 99})
		case "foreign_load":
			var d doc
			_, err := ctx.Load(pdk.Aggregate, "order", m.ID, &d)
			return err
		case "load_flood": // Arg loads, whatever they answer; then the count that succeeded
			n, _ := strconv.Atoi(m.Arg)
			ok := 0
			for range n {
				var d doc
				if _, err := ctx.Load(pdk.Projection, "behave", m.ID, &d); err == nil {
					ok++
				}
			}
			return ctx.Emit("ops-"+m.ID, "Op", Op{Op: "done", ID: m.ID, Arg: strconv.Itoa(ok)})
		case "read_pages": // stream Arg from its start, page by page, to its end: "events/pages"
			events, pages := 0, 0
			for from := int64(0); ; pages++ {
				evs, err := ctx.ReadStream(m.Arg, from, 1000)
				if err != nil {
					return err
				}
				if len(evs) == 0 {
					break
				}
				events += len(evs)
				from = evs[len(evs)-1].Position + 1
			}
			return ctx.Emit("ops-"+m.ID, "Op", Op{Op: "done", ID: m.ID, Arg: strconv.Itoa(events) + "/" + strconv.Itoa(pages)})
		case "read_flood": // stream Arg from its start, again and again
			for {
				if _, err := ctx.ReadStream(m.Arg, 0, 1000); err != nil {
					return err
				}
			}
		case "read":
			evs, err := ctx.ReadStream(m.Arg, 0, 10)
			if err != nil {
				return err
			}
			return ctx.Emit("ops-"+m.ID, "Op", Op{Op: "read", ID: m.ID, Arg: string(rune('0' + len(evs)))})
		}
		return nil
	})
}

func main() {}
