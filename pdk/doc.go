// Package pdk is the Go kit for writing protean-host handler modules.
//
// A module declares, from init, its name, the message types it handles or
// emits (fields come from the payload struct's json tags), and its
// handlers; pdk.On routes a message type to a typed function:
//
//	func init() {
//		pdk.Module("orders", "1.0.0")
//		pdk.Command[PlaceOrder]("PlaceOrder", "order")
//		pdk.Event[OrderPlaced]("OrderPlaced", "order")
//		pdk.On(pdk.CommandHandler("orders", "order"), "PlaceOrder", placeOrder)
//	}
//
//	func placeOrder(ctx *pdk.Context, cmd PlaceOrder) error {
//		var o Order
//		v, err := ctx.Load(pdk.Aggregate, "order", cmd.OrderID, &o)
//		...
//		ctx.Save(pdk.Aggregate, "order", cmd.OrderID, v, o)
//		return ctx.EmitExpecting("order-"+cmd.OrderID, "OrderPlaced", ev, abi.NoStream)
//	}
//
//	func main() {}
//
// Build with the plain Go toolchain:
//
//	GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 go build -trimpath -buildmode=c-shared -o orders.wasm .
//
// The kit exports protean_manifest and protean_handle (package abi) and
// calls the host through github.com/extism/go-pdk. A handler's effects
// (Save, Emit, Dispatch) take effect only if it returns nil; within a batch,
// Load sees the writes of the batch's earlier messages. Return Rejected
// when the domain says no, Transient when a retry may help; any other error
// (or a panic) fails the message permanently. An error from Load or
// ReadStream keeps the host's kind (a *HostError inside an *Error): a
// request outside the module's scope fails the message permanently, a
// store failure transiently, so returning it as is does the right thing.
//
// The kit speaks ABI v2 (abi/v2.md): the batch arrives and the results
// leave in one bulk copy each, in a binary envelope, and loads go through
// host functions that write into the module's memory. Build with
// -ldflags "-X github.com/proteanhq/protean-host/pdk.abiFlag=1" for a host
// older than v2.
//
// Speed. Within a batch, a record saved by an earlier message is not
// decoded again: Load hands out a copy of the saved value when it is
// loaded into the same type (reference fields such as slices and maps are
// shared with it, so do not change a value after saving it). Payloads and
// records go through encoding/json, by reflection, unless their type has
// its own codec: a DecodeJSON(b []byte) error method on the pointer
// (JSONDecoder) and an AppendJSON(b []byte) ([]byte, error) method on the
// value (JSONAppender). Fields, Elements, String, Float, Int, AppendString
// and AppendFloat make those a few lines; see
// plugins/examples/client_orders/codec.go and orders/codec.go, and check
// one against encoding/json with pdktest.Codec. pdk.On stays as it is.
// For the example command handler (orders' PlaceOrder) the codecs halve
// the guest's time a call (BenchmarkCommandHandler in internal/host).
//
// Only export_wasm.go needs wasip1; the rest builds natively, so handler
// logic can be unit-tested with go test: package pdktest runs a module's
// registered handlers against an in-memory host (commands, events, records,
// streams) through the same code the export runs.
package pdk
