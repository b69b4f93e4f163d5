package position

import (
	"encoding/json"
	"fmt"
	"testing"
)

// TestPayloadsFitPostgres pins the split of a transaction's advances into
// notifications PostgreSQL takes (under 8,000 bytes each), none lost.
func TestPayloadsFitPostgres(t *testing.T) {
	var advances []Advanced
	for i := range 300 {
		advances = append(advances, Advanced{Group: "client_orders", Unit: fmt.Sprintf("order:c-%06d", i),
			Positions: map[string]int64{fmt.Sprintf("order:c-%06d", i): int64(1_000_000 + i)}})
	}
	ps, err := payloads(advances)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) < 2 {
		t.Fatalf("%d payloads for 300 advances", len(ps))
	}
	var back []Advanced
	for _, p := range ps {
		if len(p) > maxPayload {
			t.Fatalf("a payload of %d bytes", len(p))
		}
		var a []Advanced
		if err := json.Unmarshal([]byte(p), &a); err != nil {
			t.Fatal(err)
		}
		back = append(back, a...)
	}
	x, _ := json.Marshal(back)
	y, _ := json.Marshal(advances)
	if string(x) != string(y) {
		t.Fatalf("the payloads hold %d advances, not the %d given, in order", len(back), len(advances))
	}
}
