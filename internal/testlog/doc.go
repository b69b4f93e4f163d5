// Package testlog is a log destination for tests: the code under test
// writes it from its own goroutines (a slog handler, a host's stderr) while
// the test goroutine reads it, so every access holds one lock.
package testlog
