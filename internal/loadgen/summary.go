package loadgen

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// topN is how many entries of each profile the summary keeps.
const topN = 8

// summary renders the records: per configuration each process's CPU over
// the maximum phase, then per host the top entries of its profiles (go
// tool pprof -top) and its most common goroutine stacks.
func (p *profiler) summary(ctx context.Context) string {
	p.mu.Lock()
	records := slices.Clone(p.records)
	p.mu.Unlock()
	goBin, goErr := exec.LookPath("go")
	var b strings.Builder
	for _, r := range records {
		fmt.Fprintf(&b, "## %s, maximum phase (%s)\n\n", r.config, r.wall.Round(10*time.Millisecond))
		b.WriteString("CPU over the phase (cores = CPU time / wall time; per order = CPU time / the phase's orders):\n")
		perOrder := func(d time.Duration) string {
			if r.orders <= 0 {
				return ""
			}
			return fmt.Sprintf("  %.3f ms per order", d.Seconds()*1000/float64(r.orders))
		}
		for _, c := range r.cpu {
			if c.used < 0 {
				fmt.Fprintf(&b, "  %-9s not found\n", c.name)
				continue
			}
			fmt.Fprintf(&b, "  %-9s %6.2fs  %.2f cores%s\n", c.name, c.used.Seconds(), c.used.Seconds()/r.wall.Seconds(), perOrder(c.used))
		}
		if r.machine >= 0 {
			fmt.Fprintf(&b, "  %-9s %6.2fs  %.2f cores%s (every process, this run's and others')\n", "machine", r.machine.Seconds(), r.machine.Seconds()/r.wall.Seconds(), perOrder(r.machine))
		}
		for _, e := range r.errs {
			fmt.Fprintf(&b, "  missing: %s\n", e)
		}
		if r.statements.calls > 0 {
			fmt.Fprintf(&b, "\nPostgreSQL statements over the phase (pg_stat_statements, top %d by execution time; %d orders):\n", statementsTop, r.orders)
			for _, l := range statementLines(r.statements, r.topStatements, r.orders) {
				b.WriteString("  " + l + "\n")
			}
		}
		files := slices.Clone(r.files)
		slices.SortStableFunc(files, func(x, y savedProfile) int {
			if x.host != y.host {
				return x.host - y.host
			}
			return slices.Index(profileKinds, x.kind) - slices.Index(profileKinds, y.kind)
		})
		for _, f := range files {
			fmt.Fprintf(&b, "\nhost%d %s (%s):\n", f.host, f.kind, filepath.Base(f.path))
			var lines []string
			var err error
			if f.kind == "goroutines" {
				lines, err = goroutineSummary(f.path)
			} else if goErr != nil {
				err = fmt.Errorf("go tool pprof: %w", goErr)
			} else {
				lines, err = pprofTop(ctx, goBin, f.path)
			}
			if err != nil {
				fmt.Fprintf(&b, "  %v\n", err)
			}
			for _, l := range lines {
				b.WriteString("  " + l + "\n")
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// profileKinds orders a host's profiles in the summary.
var profileKinds = []string{"cpu", "block", "mutex", "allocs", "goroutines"}

// pprofTop runs go tool pprof -top on file and keeps its table.
func pprofTop(ctx context.Context, goBin, file string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, goBin, "tool", "pprof", "-top", fmt.Sprintf("-nodecount=%d", topN), file).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("go tool pprof -top %s: %v: %s", file, err, strings.TrimSpace(string(out)))
	}
	return topTable(string(out)), nil
}

// topTable keeps, of go tool pprof -top's output, the profile's duration
// and total, what the shown nodes account for, and the table (its header
// and rows).
func topTable(out string) []string {
	var keep []string
	table := false
	for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		switch {
		case table:
			keep = append(keep, l)
		case strings.Contains(l, "flat%") && strings.Contains(l, "cum%"):
			table = true
			keep = append(keep, l)
		case strings.HasPrefix(l, "Duration:"), strings.HasPrefix(l, "Showing nodes accounting"):
			keep = append(keep, l)
		}
	}
	return keep
}

// goroutineStack is one stack of a goroutine dump (debug=1) and how many
// goroutines stand in it.
type goroutineStack struct {
	count  int
	frames []string // function names, innermost first
}

// parseGoroutines parses a goroutine?debug=1 dump: "goroutine profile:
// total N", then blocks of "COUNT @ ADDRS" followed by "#\tADDR\tFUNC+OFF\tFILE:LINE"
// frames (and "# labels: ..." lines), separated by blank lines. It
// returns the total and the stacks, the most goroutines first.
func parseGoroutines(dump string) (int, []goroutineStack, error) {
	sc := bufio.NewScanner(strings.NewReader(dump))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	total := -1
	var stacks []goroutineStack
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "goroutine profile: total "):
			n, err := strconv.Atoi(strings.TrimPrefix(l, "goroutine profile: total "))
			if err != nil {
				return 0, nil, fmt.Errorf("goroutine dump: %q: %w", l, err)
			}
			total = n
		case strings.Contains(l, " @ "):
			n, err := strconv.Atoi(strings.TrimSpace(l[:strings.Index(l, " @ ")]))
			if err != nil {
				return 0, nil, fmt.Errorf("goroutine dump: %q: %w", l, err)
			}
			stacks = append(stacks, goroutineStack{count: n})
		case strings.HasPrefix(l, "#\t") && len(stacks) > 0:
			f := strings.Split(l, "\t")
			if len(f) < 3 {
				continue
			}
			fn := f[2]
			if i := strings.LastIndex(fn, "+0x"); i > 0 {
				fn = fn[:i]
			}
			s := &stacks[len(stacks)-1]
			s.frames = append(s.frames, fn)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, nil, err
	}
	if total < 0 {
		return 0, nil, fmt.Errorf("goroutine dump: no %q line", "goroutine profile: total")
	}
	slices.SortStableFunc(stacks, func(a, b goroutineStack) int { return b.count - a.count })
	return total, stacks, nil
}

// waitAndOwner names a stack by where it waits (its innermost frame
// outside package runtime) and whose goroutine it is (its outermost
// frame but runtime.goexit, the function the goroutine was started
// with).
func (s goroutineStack) waitAndOwner() (wait, owner string) {
	for _, f := range s.frames {
		if !strings.HasPrefix(f, "runtime.") {
			wait = f
			break
		}
	}
	for i := len(s.frames) - 1; i >= 0 && owner == ""; i-- {
		if s.frames[i] != "runtime.goexit" {
			owner = s.frames[i]
		}
	}
	if wait == "" && len(s.frames) > 0 {
		wait = s.frames[0]
	}
	return wait, owner
}

// goroutineSummary is the top stacks of the dump in file, one line each.
func goroutineSummary(file string) ([]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	total, stacks, err := parseGoroutines(string(b))
	if err != nil {
		return nil, err
	}
	lines := []string{fmt.Sprintf("%d goroutines in %d stacks; the %d largest (count, where it waits, whose goroutine):", total, len(stacks), min(topN, len(stacks)))}
	for _, s := range stacks[:min(topN, len(stacks))] {
		wait, owner := s.waitAndOwner()
		lines = append(lines, fmt.Sprintf("%5d  %s  in %s", s.count, wait, owner))
	}
	return lines, nil
}
