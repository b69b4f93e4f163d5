// Package pdktest runs a module's handlers natively, in go test, against an
// in-memory host: no WASM build, no host process, a debugger that works.
//
// The handlers are the ones the module registers from init with package
// pdk (pdk.On and friends): a test in the module's own package gets them by
// being compiled with it. pdktest calls them through the same code the
// protean_handle export runs, with host functions served from memory:
//
//	func TestPlaceOrder(t *testing.T) {
//		h := pdktest.New(t)
//		res := h.Command("PlaceOrder", PlaceOrder{OrderID: "o-1", ClientID: "c-1", Total: 42})
//		require.NoError(t, res.Err)
//		require.Equal(t, "OrderPlaced", res.Events[0].Type)
//
//		res = h.Command("PlaceOrder", PlaceOrder{OrderID: "o-1", ClientID: "c-1", Total: 42})
//		require.Equal(t, abi.ErrorRejected, res.Kind()) // placed twice
//	}
//
//	func TestProjector(t *testing.T) {
//		h := pdktest.New(t)
//		h.Event("order-o-1", "OrderPlaced", OrderPlaced{OrderID: "o-1", ClientID: "c-1", Total: 42})
//		var doc ClientOrders
//		require.Equal(t, int64(1), h.Load(pdk.Projection, "client_orders", "c-1", &doc))
//	}
//
// Command sends a command to the module's command handler for its type,
// after the host's check of its fields against the declaration;
// Event appends an event to a stream and hands it to every event handler,
// projector and process manager of the module that handles its type. The
// effects of a handler that returns nil are applied at once, all or
// nothing, as the host's unit of work would: record writes checked against
// their expected versions, events appended (checked against theirs). A
// version mismatch fails the message with a transient error wrapping
// ErrConflict, and the module's output goes through the same checks the
// host applies (package abi), so an output the host would refuse fails
// here too. Commands a handler dispatches are returned in its Result, not
// run: call Command with them to follow the chain. Events a handler emits
// are stored, not delivered: call Event to hand one to a subscriber.
//
// Codec checks a type's own JSON codec (pdk.JSONDecoder, pdk.JSONAppender)
// against encoding/json, which the kit uses for every type without one.
//
// What pdktest does not do is the host's scope check (which records,
// streams and event types a module may touch) and its partition-key rules:
// `protean-host plugin test` runs the built module on the real engine for
// those.
//
// A Host is for one test goroutine; it is not safe for concurrent use.
package pdktest
