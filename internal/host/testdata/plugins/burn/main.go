// Command burn is a test module whose one command spins, never calling
// the host, until its deadline stops it: a tenant's CPU-bound calls.
// Built with -ldflags "-X main.n=N" it is module burnN, with command
// BurnN on category burnN, so that copies load side by side in one set.
package main

import "github.com/proteanhq/protean-host/pdk"

var n = "1"

var sink []byte

type Burn struct {
	ID string `json:"id"`
}

func init() {
	name := "burn" + n
	pdk.Module(name, "1.0.0")
	pdk.Command[Burn]("Burn"+n, name)
	pdk.Event[Burn]("Burned"+n, name)
	pdk.On(pdk.CommandHandler(name, name), "Burn"+n, func(ctx *pdk.Context, c Burn) error {
		for {
			sink = append(sink[:0], 1)
		}
	})
}

func main() {}
