package loadgen

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on
// every Linux architecture Go builds for (reading sysconf would need cgo).
const clockTicks = 100

// procStat is what the CPU accounting reads from /proc/<pid>/stat.
type procStat struct {
	ppid int
	comm string
	// ticks is utime+stime (every thread of the process); childTicks is
	// cutime+cstime, the children it has reaped (PostgreSQL's ended
	// backends, once the postmaster has waited for them).
	ticks, childTicks int64
}

// parseProcStat parses one /proc/<pid>/stat line. comm is in parentheses
// and may hold spaces and parentheses itself, so the fields are counted
// from its last ')'.
func parseProcStat(line string) (procStat, error) {
	open, end := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("proc stat %q: no (comm)", line)
	}
	// After comm: state ppid pgrp session tty_nr tpgid flags minflt
	// cminflt majflt cmajflt utime stime cutime cstime ...
	f := strings.Fields(line[end+1:])
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("proc stat %q: %d fields after comm, want at least 15", line, len(f))
	}
	var n [5]int64
	for i, idx := range []int{1, 11, 12, 13, 14} {
		v, err := strconv.ParseInt(f[idx], 10, 64)
		if err != nil {
			return procStat{}, fmt.Errorf("proc stat %q: field %d: %w", line, idx+3, err)
		}
		n[i] = v
	}
	return procStat{ppid: int(n[0]), comm: line[open+1 : end], ticks: n[1] + n[2], childTicks: n[3] + n[4]}, nil
}

// readProcs reads every process's stat under root (/proc); a process
// that ends while it is read is left out.
func readProcs(root string) map[int]procStat {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	procs := make(map[int]procStat, len(entries))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, e.Name(), "stat"))
		if err != nil {
			continue
		}
		if st, err := parseProcStat(strings.TrimSpace(string(b))); err == nil {
			procs[pid] = st
		}
	}
	return procs
}

// treeTicks is the CPU, in ticks, that pid and its descendants have used:
// each live one's own and what it has reaped. A descendant that ends
// moves its time into its parent's reaped share, so the difference
// between two readings counts it once. With tree false, pid's own only.
// ok is false when pid is not running.
func treeTicks(procs map[int]procStat, pid int, tree bool) (ticks int64, ok bool) {
	root, ok := procs[pid]
	if !ok {
		return 0, false
	}
	if !tree {
		return root.ticks, true
	}
	children := map[int][]int{}
	for p, st := range procs {
		children[st.ppid] = append(children[st.ppid], p)
	}
	seen := map[int]bool{}
	stack := []int{pid}
	for len(stack) > 0 {
		p := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[p] {
			continue
		}
		seen[p] = true
		ticks += procs[p].ticks + procs[p].childTicks
		stack = append(stack, children[p]...)
	}
	return ticks, true
}

// machineTicks is the machine's busy time, in ticks summed over its
// cores, from /proc/stat's cpu line (everything but idle and iowait): the
// other work on a shared machine shows as the gap to the processes'.
func machineTicks(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 6 || f[0] != "cpu" {
		return 0, false
	}
	var busy int64
	for i, s := range f[1:] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, false
		}
		// user nice system idle iowait irq softirq steal guest guest_nice;
		// guest time is already in user and nice.
		switch i {
		case 3, 4, 8, 9:
		default:
			busy += v
		}
	}
	return busy, true
}

// childWith is the pid of a child of parent whose comm is comm, or (comm
// "") whose command line holds arg; 0 if none.
func childWith(procs map[int]procStat, root string, parent int, comm, arg string) int {
	for pid, st := range procs {
		if st.ppid != parent {
			continue
		}
		if comm != "" && st.comm == comm {
			return pid
		}
		if arg == "" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(arg)) {
			return pid
		}
	}
	return 0
}

// pidFile is the pid on the first line of a PostgreSQL postmaster.pid (or
// any pid file), 0 if unreadable.
func pidFile(path string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(sc.Text()))
	return n
}
