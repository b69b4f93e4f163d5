package testlog

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is an io.Writer safe for concurrent use. The zero value is ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Take returns what was written since the last Take (or since the start)
// and forgets it.
func (l *Buffer) Take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.b.String()
	l.b.Reset()
	return out
}

// Tail returns the last n lines written.
func (l *Buffer) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(l.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
