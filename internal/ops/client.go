package ops

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/proteanhq/protean-host/internal/audit"
)

// MaxAnswerBytes bounds what a Client reads of one answer: a list of
// partitions or an audit page is far smaller, and a host (or something
// posing as one) cannot make the CLI hold more.
const MaxAnswerBytes = 16 << 20

// ErrUnauthenticated: the host did not accept the credentials (401): no
// key, or one it does not know.
var ErrUnauthenticated = errors.New("the host did not accept the credentials")

// StatusError is a host's answer other than 200: its status code and the
// message of its {"error": "..."} body. It unwraps to the error of the
// status: ErrForbidden (403), ErrNotFound (404), ErrConflict (409),
// ErrInvalid (400), ErrUnauthenticated (401), nothing for the rest.
type StatusError struct {
	Code    int
	Message string
	// keyless: the request carried no key (a 401 then says to set one).
	keyless bool
}

func (e *StatusError) Error() string {
	if e.Code == http.StatusUnauthorized {
		if e.keyless {
			return fmt.Sprintf("the host answered 401 (%s): it requires an API key; set the environment variable PROTEAN_API_KEY to an operator's or an admin's key", e.Message)
		}
		return fmt.Sprintf("the host answered 401 (%s): it does not know the key in PROTEAN_API_KEY; check it (a key of this host's [[http.auth.keys]], not revoked)", e.Message)
	}
	return fmt.Sprintf("the host answered %d: %s", e.Code, e.Message)
}

// Unwrap returns the ops error of the status.
func (e *StatusError) Unwrap() error {
	switch e.Code {
	case http.StatusForbidden:
		return ErrForbidden
	case http.StatusNotFound:
		return ErrNotFound
	case http.StatusConflict:
		return ErrConflict
	case http.StatusBadRequest:
		return ErrInvalid
	case http.StatusUnauthorized:
		return ErrUnauthenticated
	}
	return nil
}

// Client is the API of a running host, over its HTTP routes under
// /v1/ops. The host decides the scope from the key; a Client ignores
// the Scope it is given, and the Act's By (the host names the key).
type Client struct {
	base string
	key  string
	hc   *http.Client
}

var _ API = (*Client)(nil)

// NewClient returns the Client of the host at base (as
// "http://127.0.0.1:8080"), sending key ("": none) as a bearer token,
// each call bounded by timeout.
func NewClient(base, key string, timeout time.Duration) (*Client, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("host URL %q: want http://HOST:PORT or https://HOST:PORT", base)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("host URL %q: want no query or fragment", base)
	}
	return &Client{base: strings.TrimRight(u.String(), "/"), key: key, hc: &http.Client{Timeout: timeout}}, nil
}

// path joins the escaped segments under /v1/ops.
func path(segs ...string) string {
	var b strings.Builder
	b.WriteString("/v1/ops")
	for _, s := range segs {
		b.WriteString("/")
		b.WriteString(url.PathEscape(s))
	}
	return b.String()
}

// do sends method to p (with query q and body in, if set) and decodes a
// 200's body into out.
func (c *Client) do(ctx context.Context, method, p string, q url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	u := c.base + p
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswerBytes+1))
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, p, err)
	}
	if len(raw) > MaxAnswerBytes {
		return fmt.Errorf("%s %s: the answer is larger than %d bytes", method, p, MaxAnswerBytes)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		msg := strings.TrimSpace(string(raw))
		if json.Unmarshal(raw, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		if len(msg) > 1024 {
			msg = msg[:1024] + "…"
		}
		return &StatusError{Code: resp.StatusCode, Message: msg, keyless: c.key == ""}
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("%s %s: the answer is not what the operations API returns: %w", method, p, err)
	}
	return nil
}

// actBody is an action's request body.
type actBody struct {
	Group  string `json:"group,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Partitions implements API.
func (c *Client) Partitions(ctx context.Context, _ Scope) ([]Partition, error) {
	var out []Partition
	err := c.do(ctx, http.MethodGet, path("partitions"), nil, nil, &out)
	return out, err
}

// Partition implements API.
func (c *Client) Partition(ctx context.Context, _ Scope, category, key string) ([]PartitionDetail, error) {
	var out []PartitionDetail
	err := c.do(ctx, http.MethodGet, path("partitions", category, key), nil, nil, &out)
	return out, err
}

// ActOnPartition implements API.
func (c *Client) ActOnPartition(ctx context.Context, _ Scope, act Act, category, key, group string) (Done, error) {
	var out Done
	err := c.do(ctx, http.MethodPost, path("partitions", category, key, act.Action), nil, actBody{Group: group, Reason: act.Reason}, &out)
	return out, err
}

// Subscriptions implements API.
func (c *Client) Subscriptions(ctx context.Context, _ Scope) ([]Subscription, error) {
	var out []Subscription
	err := c.do(ctx, http.MethodGet, path("subscriptions"), nil, nil, &out)
	return out, err
}

// Failures implements API.
func (c *Client) Failures(ctx context.Context, _ Scope, all bool) ([]Failure, error) {
	var out []Failure
	err := c.do(ctx, http.MethodGet, path("subscriptions", "failures"), url.Values{"all": {strconv.FormatBool(all)}}, nil, &out)
	return out, err
}

// ActOnFailure implements API.
func (c *Client) ActOnFailure(ctx context.Context, _ Scope, act Act, group, unit string, pos int64) (Done, error) {
	var out Done
	err := c.do(ctx, http.MethodPost, path("subscriptions", group, unit, strconv.FormatInt(pos, 10), act.Action), nil, actBody{Reason: act.Reason}, &out)
	return out, err
}

// Outbox implements API.
func (c *Client) Outbox(ctx context.Context, _ Scope) (Outbox, error) {
	var out Outbox
	err := c.do(ctx, http.MethodGet, path("outbox"), nil, nil, &out)
	return out, err
}

// ActOnOutbox implements API.
func (c *Client) ActOnOutbox(ctx context.Context, _ Scope, act Act, id int64) (Done, error) {
	var out Done
	err := c.do(ctx, http.MethodPost, path("outbox", strconv.FormatInt(id, 10), act.Action), nil, actBody{Reason: act.Reason}, &out)
	return out, err
}

// DeadLetters implements API.
func (c *Client) DeadLetters(ctx context.Context, _ Scope) ([]DeadLetter, error) {
	var out []DeadLetter
	err := c.do(ctx, http.MethodGet, path("dead-letters"), nil, nil, &out)
	return out, err
}

// ReplayDeadLetter implements API.
func (c *Client) ReplayDeadLetter(ctx context.Context, _ Scope, act Act, stream, group, id string) (Done, error) {
	if err := CheckReplay(act); err != nil {
		return Done{}, err
	}
	var out Done
	err := c.do(ctx, http.MethodPost, path("dead-letters", stream, group, id, act.Action), nil, actBody{Reason: act.Reason}, &out)
	return out, err
}

// Audit implements API; q.Tenants is the host's to decide.
func (c *Client) Audit(ctx context.Context, _ Scope, q audit.Query) ([]audit.Entry, error) {
	v := url.Values{}
	if q.Before > 0 {
		v.Set("before", strconv.FormatInt(q.Before, 10))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	var out []audit.Entry
	err := c.do(ctx, http.MethodGet, path("audit"), v, nil, &out)
	return out, err
}
