package owner

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
)

// maxHost bounds the hostname's part, so that a name fits the outbox's
// locked_by (varchar(128)) whatever the hostname.
const maxHost = 64

// New returns a new owner name, "{hostname}:{pid}:{12 hex digits}". Each
// call answers another name: call it once per host start and pass the
// name to every component of that start.
func New() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	if len(host) > maxHost {
		host = host[:maxHost]
	}
	var b [6]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it aborts the program instead)
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
