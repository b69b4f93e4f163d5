package testserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// respConn is the little of the Redis protocol the harness needs (ping,
// select, scan, unlink), so that it does not pull a client library into
// every test binary.
type respConn struct {
	c net.Conn
	r *bufio.Reader
}

// dialRedis connects to a redis:// URL, authenticating and selecting its
// database number as the URL says.
func dialRedis(ctx context.Context, rawURL string) (*respConn, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "redis" {
		return nil, fmt.Errorf("redis url %q: want redis://host:port/db", rawURL)
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "6379")
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	} else {
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	}
	rc := &respConn{c: c, r: bufio.NewReader(c)}
	if u.User != nil {
		pw, ok := u.User.Password()
		args := []string{"AUTH", u.User.Username(), pw}
		if !ok {
			args = []string{"AUTH", u.User.Username()}
		}
		if u.User.Username() == "" {
			args = []string{"AUTH", pw}
		}
		if _, err := rc.do(args...); err != nil {
			rc.close()
			return nil, err
		}
	}
	if db := strings.Trim(u.Path, "/"); db != "" && db != "0" {
		if _, err := rc.do("SELECT", db); err != nil {
			rc.close()
			return nil, err
		}
	}
	return rc, nil
}

func (rc *respConn) close() { _ = rc.c.Close() }

// do sends a command and returns its reply: a string, an int64, nil, or a
// []any of those.
func (rc *respConn) do(args ...string) (any, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(rc.c, b.String()); err != nil {
		return nil, err
	}
	return rc.read()
}

func (rc *respConn) read() (any, error) {
	line, err := rc.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("redis: empty reply")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return nil, errors.New("redis: " + line[1:])
	case ':':
		return strconv.ParseInt(line[1:], 10, 64)
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rc.r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = rc.read(); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("redis: unexpected reply %q", line)
}

// redisDeletePrefix deletes every key that starts with prefix.
func redisDeletePrefix(ctx context.Context, redisURL, prefix string) error {
	rc, err := dialRedis(ctx, redisURL)
	if err != nil {
		return err
	}
	defer rc.close()
	cursor := "0"
	for {
		reply, err := rc.do("SCAN", cursor, "MATCH", escapeGlob(prefix)+"*", "COUNT", "1000")
		if err != nil {
			return err
		}
		parts, ok := reply.([]any)
		if !ok || len(parts) != 2 {
			return fmt.Errorf("redis: SCAN: unexpected reply %v", reply)
		}
		cursor, _ = parts[0].(string)
		keys, _ := parts[1].([]any)
		if len(keys) > 0 {
			args := []string{"UNLINK"}
			for _, k := range keys {
				s, _ := k.(string)
				args = append(args, s)
			}
			if _, err := rc.do(args...); err != nil {
				return err
			}
		}
		if cursor == "0" {
			return nil
		}
	}
}

func escapeGlob(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
	return r.Replace(s)
}
