package position

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Channel is the PostgreSQL notification channel on which a notifying
// store (Postgres.Notifying) announces every advance it commits: each
// notification's payload is a JSON array of Advanced. PostgreSQL delivers
// a notification when, and only when, the transaction that sent it
// commits, so a listener (Advances) learns of an advance once its effects
// are visible to every other session: what another host's wait for a
// read of one's own write needs instead of polling the row.
const Channel = "protean_positions"

// maxPayload bounds one notification's payload, below PostgreSQL's 8,000
// bytes; a transaction's advances that need more go in several.
const maxPayload = 7000

// Advanced is one unit's advance as notified: the positions its fences
// moved it to.
type Advanced struct {
	Group     string           `json:"g"`
	Unit      string           `json:"u"`
	Positions map[string]int64 `json:"p"`
}

// Notifying returns the store with notifications on: the fenced advances
// of its transactions (PostgresTx.Advance, QueueAdvance) also notify
// Channel, in the same transaction.
func (p *Postgres) Notifying() *Postgres {
	n := *p
	n.notify = true
	return &n
}

// payloads encodes advances as notification payloads of at most
// maxPayload bytes each (an advance alone past it goes alone).
func payloads(advances []Advanced) ([]string, error) {
	var out []string
	batch := make([]json.RawMessage, 0, len(advances))
	size := 2
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		b, err := json.Marshal(batch)
		if err != nil {
			return err
		}
		out = append(out, string(b))
		batch, size = batch[:0], 2
		return nil
	}
	for _, a := range advances {
		b, err := json.Marshal(a)
		if err != nil {
			return nil, err
		}
		if size+len(b)+1 > maxPayload {
			if err := flush(); err != nil {
				return nil, err
			}
		}
		batch = append(batch, b)
		size += len(b) + 1
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

const notifySQL = `SELECT pg_notify($1, $2)`

// Advances is the handler of Channel's notifications for a listener
// (pglisten.Listener.Subscribe, or pglisten.Listen on a connection of its
// own): it calls fn with each notification's advances, in the order
// PostgreSQL delivers them (commit order), and refuses a payload that is
// not advances. What was committed while the listener was away is not
// delivered: a listener is a hint, and a wait that misses one reads the
// row at its safety poll.
func Advances(fn func([]Advanced)) func(payload string) error {
	return func(payload string) error {
		var advances []Advanced
		if err := json.Unmarshal([]byte(payload), &advances); err != nil {
			return errors.Join(fmt.Errorf("positions: a notification on %s that is not advances: %q", Channel, payload), err)
		}
		fn(advances)
		return nil
	}
}
