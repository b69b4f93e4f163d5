package pdk

import (
	"encoding/json"
	"fmt"

	"github.com/proteanhq/protean-host/abi"
)

// handle runs a HandleRequest and returns the HandleResponse JSON. It stops
// at the first failing message: the host commits the results before it and
// retries it alone. A panicking handler fails its message permanently
// instead of trapping the whole batch.
func handle(in []byte, h host) ([]byte, error) {
	var req abi.HandleRequest
	if err := json.Unmarshal(in, &req); err != nil {
		return nil, fmt.Errorf("pdk: decode handle request: %w", err)
	}
	resp, err := handleRequest(&req, h)
	if err != nil {
		return nil, err
	}
	return json.Marshal(resp)
}

// handleV2 is handle on ABI v2's binary encoding (abi/v2.md).
func handleV2(in []byte, h host) ([]byte, error) {
	req, err := abi.DecodeHandleRequestV2(in)
	if err != nil {
		return nil, fmt.Errorf("pdk: decode handle request: %w", err)
	}
	resp, err := handleRequest(req, h)
	if err != nil {
		return nil, err
	}
	return abi.AppendHandleResponseV2(make([]byte, 0, 256*len(resp.Results)+16), resp), nil
}

func handleRequest(req *abi.HandleRequest, h host) (*abi.HandleResponse, error) {
	hd := mod.handler(req.Handler)
	if hd == nil {
		return nil, fmt.Errorf("pdk: module %s has no handler %q", mod.info.Name, req.Handler)
	}
	batch := overlay{}
	resp := &abi.HandleResponse{Results: make([]abi.Result, 0, len(req.Messages))}
	effects := make([]abi.Effects, len(req.Messages))
	for i, env := range req.Messages {
		ctx := &Context{env: env, handler: hd, host: h, batch: &batch} // staged: made by the first Save
		err := run(hd, ctx, env)
		if err != nil {
			resp.Results = append(resp.Results, abi.Result{Error: toABIError(err)})
			break
		}
		for _, s := range ctx.staged {
			batch[s.key] = s.rec
		}
		effects[i] = ctx.effects
		resp.Results = append(resp.Results, abi.Result{Effects: &effects[i]})
	}
	return resp, nil
}

func run(hd *Handler, ctx *Context, env abi.Envelope) (err error) {
	route, ok := hd.routes[env.Type]
	if !ok {
		return Permanent(fmt.Errorf("handler %s does not handle %s", hd.decl.Name, env.Type))
	}
	defer func() {
		if r := recover(); r != nil {
			err = Permanent(fmt.Errorf("handler %s panicked on %s: %v", hd.decl.Name, env.Type, r))
		}
	}()
	return route(ctx, env.Data)
}
