package loadgen

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/proteanhq/protean-host/internal/serverbin"
)

// statementsTop is how many statements the summary lists per phase.
const statementsTop = 12

// slowPlanMS is how long a statement runs before auto_explain logs its
// plan, in a profiled run.
const slowPlanMS = 20

// statementsSettings are the server settings that load pg_stat_statements
// and auto_explain (the plan of every statement slower than slowPlanMS
// goes to the server's log), and log every autovacuum and autoanalyze
// (an analyze replans every connection's statements on its table: set
// beside the tail's orders in time), and count each statement's plans
// (a statement the plan cache plans on every call is planned as often as
// it runs), when the libraries are installed beside the
// server's binaries (Debian's postgresql package ships them); ok is false
// when they are not.
func statementsSettings() (settings []string, ok bool) {
	bin, err := serverbin.PostgresBinDir()
	if err != nil {
		return nil, false
	}
	for _, lib := range []string{"pg_stat_statements", "auto_explain"} {
		if _, err := os.Stat(filepath.Join(bin, "..", "lib", lib+".so")); err != nil {
			return nil, false
		}
	}
	return []string{"shared_preload_libraries=pg_stat_statements,auto_explain",
		fmt.Sprintf("auto_explain.log_min_duration=%d", slowPlanMS), "auto_explain.log_format=text",
		"log_autovacuum_min_duration=0", "pg_stat_statements.track_planning=on"}, true
}

// statements reads PostgreSQL's per-statement statistics
// (pg_stat_statements) over each maximum phase: which statements the
// path runs, how often per order, and where the server's time goes.
type statements struct {
	conn *pgx.Conn
}

// openStatements connects to url and creates the extension; the server
// must have been started with statementsSettings.
func openStatements(ctx context.Context, url string) (*statements, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("pg_stat_statements: %w", err)
	}
	return &statements{conn: conn}, nil
}

func (s *statements) close() {
	if s != nil {
		s.conn.Close(context.Background())
	}
}

// reset clears the statistics: a phase begins.
func (s *statements) reset(ctx context.Context) error {
	_, err := s.conn.Exec(ctx, "SELECT pg_stat_statements_reset()")
	return err
}

// statementStat is one statement's (or, as the total, every statement's)
// figures since the last reset.
type statementStat struct {
	calls, rows, plans int64
	exec, plan         time.Duration // execution and planning time inside the server
	query              string
}

// read answers the total over every statement and the top statements by
// execution time, this reader's own left out.
func (s *statements) read(ctx context.Context) (total statementStat, top []statementStat, err error) {
	const mine = `query NOT LIKE '%pg_stat_statements%'`
	var ms, planMS float64
	if err := s.conn.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(rows), 0)::bigint, coalesce(sum(total_exec_time), 0),
		coalesce(sum(plans), 0)::bigint, coalesce(sum(total_plan_time), 0)
		FROM pg_stat_statements WHERE `+mine).Scan(&total.calls, &total.rows, &ms, &total.plans, &planMS); err != nil {
		return total, nil, err
	}
	total.exec, total.plan = msDuration(ms), msDuration(planMS)
	rows, err := s.conn.Query(ctx, `SELECT calls, rows, total_exec_time, plans, total_plan_time, query FROM pg_stat_statements
		WHERE `+mine+` ORDER BY total_exec_time DESC LIMIT $1`, statementsTop)
	if err != nil {
		return total, nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var st statementStat
		if err := rows.Scan(&st.calls, &st.rows, &ms, &st.plans, &planMS, &st.query); err != nil {
			return total, nil, err
		}
		st.exec, st.plan = msDuration(ms), msDuration(planMS)
		top = append(top, st)
	}
	return total, top, rows.Err()
}

func msDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// statementLines renders a phase's statements: per statement its calls
// (and per order), its plans, its execution time (share, and per call)
// and its text on one line, cut at 110 characters.
func statementLines(total statementStat, top []statementStat, orders int) []string {
	perOrder := func(n int64) string {
		if orders <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", float64(n)/float64(orders))
	}
	share := func(d time.Duration) float64 {
		if total.exec <= 0 {
			return 0
		}
		return 100 * d.Seconds() / total.exec.Seconds()
	}
	out := []string{
		fmt.Sprintf("every statement: %d calls (%s per order), %.2fs executing; %d plans, %.2fs planning", total.calls, perOrder(total.calls),
			total.exec.Seconds(), total.plans, total.plan.Seconds()),
		fmt.Sprintf("%9s %9s %7s %9s %9s %9s  %s", "calls", "per order", "plans", "exec %", "µs/call", "rows", "statement"),
	}
	for _, st := range top {
		per := time.Duration(0)
		if st.calls > 0 {
			per = st.exec / time.Duration(st.calls)
		}
		q := strings.Join(strings.Fields(st.query), " ")
		if len(q) > 110 {
			q = q[:110] + "…"
		}
		out = append(out, fmt.Sprintf("%9d %9s %7d %6.1f%% %9.0f %9d  %s", st.calls, perOrder(st.calls), st.plans, share(st.exec),
			float64(per.Nanoseconds())/1000, st.rows, q))
	}
	return out
}
