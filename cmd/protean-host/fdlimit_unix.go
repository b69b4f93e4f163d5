//go:build unix

package main

import "syscall"

// openFileLimit is the process's soft limit on open files (Go raises it to
// the hard limit at start).
func openFileLimit() (int, bool) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Cur > 1<<30 {
		return 0, false
	}
	return int(r.Cur), true
}
