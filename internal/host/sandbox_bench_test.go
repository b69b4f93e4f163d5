package host

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/proteanhq/protean-host/abi"
	"github.com/proteanhq/protean-host/internal/wasmbuild"
)

type nopSession struct{}

func (nopSession) Load(context.Context, *abi.LoadRequest) abi.LoadResponse { return abi.LoadResponse{} }
func (nopSession) ReadStream(context.Context, *abi.ReadStreamRequest, int) abi.ReadStreamResponse {
	return abi.ReadStreamResponse{}
}

// BenchmarkRecycleCheck: what recycle's exit check and memory check add to
// a call (probe), beside a whole call of one trivial message (handle).
func BenchmarkRecycleCheck(b *testing.B) {
	l, err := NewLoader(LoaderOptions{CacheDir: wasmbuild.CacheDir(b), Instances: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(context.Background())
	m, err := l.LoadFile(context.Background(), wasmbuild.Build(b, "./internal/host/testdata/plugins/behave"))
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close(context.Background())
	ctx := context.Background()
	env := []abi.Envelope{{ID: "1", Type: "Op", Data: json.RawMessage(`{"op":"ok","id":"d"}`)}}
	b.Run("handle", func(b *testing.B) {
		for b.Loop() {
			if _, err := m.Handle(ctx, "behave", env, nopSession{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("probe", func(b *testing.B) {
		inst, err := m.acquire(ctx, ctx)
		if err != nil {
			b.Fatal(err)
		}
		defer m.discard(inst, discardFailed)
		for b.Loop() {
			_ = inst.exited(ctx)
			_ = inst.mem.used.Load()
		}
	})
}
