package loadgen

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
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
			if f.kind == "metrics-start" {
				continue // read with its metrics-end
			}
			fmt.Fprintf(&b, "\nhost%d %s (%s):\n", f.host, f.kind, filepath.Base(f.path))
			var lines []string
			var err error
			if f.kind == "metrics-end" {
				lines, err = counterDeltas(startOf(files, f.host), f.path)
			} else if f.kind == "goroutines" {
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
var profileKinds = []string{"cpu", "block", "mutex", "allocs", "goroutines", "metrics-start", "metrics-end"}

// startOf is the path of host's metrics at the phase's start, "" if
// they were not saved.
func startOf(files []savedProfile, host int) string {
	for _, f := range files {
		if f.host == host && f.kind == "metrics-start" {
			return f.path
		}
	}
	return ""
}

// countersTop bounds the counters the summary lists per host.
const countersTop = 40

// counterDeltas lists the host's protean_ counters that moved over the
// phase, by name: each sample's growth from the metrics in start to those
// in end (a sample absent at the start counts from 0).
func counterDeltas(start, end string) ([]string, error) {
	if start == "" {
		return nil, fmt.Errorf("no metrics from the phase's start")
	}
	before, err := counters(start)
	if err != nil {
		return nil, err
	}
	after, err := counters(end)
	if err != nil {
		return nil, err
	}
	var lines []string
	for _, name := range slices.Sorted(maps.Keys(after)) {
		if d := after[name] - before[name]; d != 0 && strings.HasPrefix(name, "protean_") {
			lines = append(lines, fmt.Sprintf("%14s  %s", strconv.FormatFloat(d, 'f', -1, 64), name))
		}
	}
	if len(lines) > countersTop {
		lines = append(lines[:countersTop], fmt.Sprintf("(%d more)", len(lines)-countersTop))
	}
	return append([]string{"counters that moved over the phase (growth, sample):"}, lines...), nil
}

// counters reads the counter samples of a Prometheus text exposition in
// file, by sample name with its labels.
func counters(file string) (map[string]float64, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	out := map[string]float64{}
	for name, fam := range families {
		if fam.GetType() != dto.MetricType_COUNTER {
			continue
		}
		for _, m := range fam.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			key := name
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			out[key] = m.GetCounter().GetValue()
		}
	}
	return out, nil
}

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
