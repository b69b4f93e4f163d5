package chaos

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// versionIn finds file's version in `protean-host validate` output.
func versionIn(out, file string) (string, error) {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == file {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("no version of %s in validate's output:\n%s", file, out)
}

// Counts is how many times each kind ran, alone and in mixed steps.
func (r *Report) Counts() (alone, mixed map[Kind]int) {
	alone, mixed = map[Kind]int{}, map[Kind]int{}
	for _, s := range r.Steps {
		for _, f := range s.Step.Faults {
			if len(s.Step.Faults) == 1 {
				alone[f.Kind]++
			} else {
				mixed[f.Kind]++
			}
		}
	}
	return alone, mixed
}

// Print writes the report: the faults that ran, then the checks.
func (r *Report) Print(w io.Writer) {
	o := r.Outcome
	alone, mixed := r.Counts()
	fmt.Fprintf(w, "\nchaos report, seed %d, %d steps\n\n", r.Seed, len(r.Steps))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FAULT\tALONE\tMIXED\tTOTAL")
	total := 0
	for _, k := range Kinds {
		if alone[k]+mixed[k] == 0 {
			continue
		}
		total += alone[k] + mixed[k]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", k, alone[k], mixed[k], alone[k]+mixed[k])
	}
	fmt.Fprintf(tw, "all\t\t\t%d\n", total)
	tw.Flush()

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tVALUE")
	row := func(name string, v any) { fmt.Fprintf(tw, "%s\t%v\n", name, v) }
	row("accepted (2xx)", o.Accepted)
	row("  of which idempotent replays", o.Replayed)
	row("resends (5xx, errors, timeouts)", o.Resends)
	row("rejected (4xx)", o.Rejected)
	row("unresolved (never 2xx/4xx)", o.Unresolved)
	row("lost (event store)", o.LostStore)
	row("lost (projection)", o.LostProjection)
	row("held by a halt (projection)", o.HeldByHalt)
	row("duplicated (event store)", o.DupStore)
	row("duplicated (projection)", o.DupProjection)
	row("reordered (projection)", o.Reordered)
	row("phantom (4xx but stored)", o.Phantom)
	row("halted partitions (any time)", o.Halted)
	row("  still halted at the end", o.HaltedAtEnd)
	row("abandoned outbox rows", o.Abandoned)
	row("host exits not caused by the harness", o.Crashes)
	if o.Crashes > 0 {
		row("  (a host that cannot reach a server at start exits; counted here)", "")
	}
	if o.Complete {
		row("last fault -> projections complete", o.CompleteAfter.Round(100*time.Millisecond))
		row("  last fault -> every client's order in hand answered", o.AnsweredAfter.Round(100*time.Millisecond))
		row("  then -> projections complete", o.CompleteAfterAnswered.Round(100*time.Millisecond))
	} else {
		row("last fault -> projections complete", fmt.Sprintf("never (gave up after %s)", o.CompleteAfter.Round(time.Second)))
	}
	tw.Flush()

	var st []string
	for s, n := range o.Outbox {
		st = append(st, fmt.Sprintf("%s=%d", s, n))
	}
	sort.Strings(st)
	fmt.Fprintf(w, "outbox rows by status: %s\n", strings.Join(st, " "))
	for _, line := range strings.Split(r.Halts, "\n") {
		if strings.Contains(line, "partition(s)") || strings.HasPrefix(line, "halted:") || strings.Contains(line, "(partitions list") {
			fmt.Fprintf(w, "partitions list: %s\n", line)
		}
	}
	if len(r.Laggards) > 0 {
		fmt.Fprintln(w, "\nlast orders to reach their projection (seconds from the end of the last fault; '-' unknown):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  ORDER\tKEY\tCOMMITTED\tPUBLISHED\tPROJECTED BY")
		secs := func(d time.Duration) string {
			if d == 0 {
				return "-"
			}
			return fmt.Sprintf("%+.1f", d.Seconds())
		}
		for _, l := range r.Laggards {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", l.Order, l.Key, secs(l.Committed), secs(l.Published), secs(l.Projected))
		}
		tw.Flush()
	}
	if len(o.Details) > 0 {
		fmt.Fprintln(w, "\nexamples:")
		for _, d := range o.Details {
			fmt.Fprintln(w, "  "+d)
		}
	}
	for _, e := range r.Errors {
		fmt.Fprintln(w, "harness error: "+e)
	}
	if v := append(o.Violations(), r.Errors...); len(v) > 0 {
		fmt.Fprintf(w, "\nFAIL: %s\n", strings.Join(v, "; "))
	} else {
		fmt.Fprintln(w, "\nPASS: every accepted order stored once and projected once in acceptance order; nothing halted or abandoned")
	}
}
