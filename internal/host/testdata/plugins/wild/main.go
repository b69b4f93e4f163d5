// Command wild is a hostile test module that hands the ABI v1 host
// functions offsets that point nowhere (past its memory, into the middle
// of nothing), then reports that it is still running: the host must answer
// with an error, never touch its own memory at those offsets, never panic.
package main

import (
	"github.com/proteanhq/protean-host/pdk"
)

//go:wasmimport extism:host/user protean_load
func wildLoad(uint64) uint64

//go:wasmimport extism:host/user protean_read_stream
func wildRead(uint64) uint64

type Op struct {
	ID string `json:"id"`
}

func init() {
	pdk.Module("wild", "1.0.0")
	pdk.Event[Op]("Wild", "wild")
	pdk.On(pdk.EventHandler("wild", "wild"), "Wild", func(ctx *pdk.Context, m Op) error {
		answers := 0
		for _, off := range []uint64{0, 1, 1 << 20, 1<<32 - 1, 1 << 40, 1<<64 - 1} {
			if wildLoad(off) != 0 {
				answers++
			}
			if wildRead(off) != 0 {
				answers++
			}
		}
		return ctx.Save(pdk.Projection, "wild", m.ID, 0, map[string]int{"answers": answers})
	})
}

func main() {}
