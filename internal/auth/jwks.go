package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

// maxJWKSBytes bounds a JWKS document: a key set is a few KiB.
const maxJWKSBytes = 1 << 20

// fetchTimeout bounds one fetch of a JWKS URL, whoever waits on it.
const fetchTimeout = 10 * time.Second

// ErrRefetchLimited is why a token naming a key not in the set fetched
// last is refused without a fetch: the set was fetched less than
// OIDCOptions.RefetchEvery ago.
var ErrRefetchLimited = errors.New("key set fetched recently: not fetched again yet")

// remoteKeys is the key set published at a JWKS URL. It is fetched at the
// first token, and again when a token names a key (kid) the set does not
// hold, so the issuer's rotation needs nothing here; but at most once per
// every, whatever the tokens name, and callers who find a fetch in
// progress wait on it rather than start their own. (go-oidc's
// RemoteKeySet shares a fetch in progress but starts a new one for every
// token it cannot verify after that: a client spraying tokens with random
// kids would make the host fetch the key set as fast as it sends them.)
type remoteKeys struct {
	url    string
	client *http.Client
	now    func() time.Time
	every  time.Duration

	mu       sync.Mutex
	keys     []jose.JSONWebKey
	fetched  time.Time  // when the last fetch started; zero: never
	inflight *keysFetch // the fetch in progress, if any
}

// keysFetch is one fetch in progress: done closes when err is set.
type keysFetch struct {
	done chan struct{}
	err  error
}

func newRemoteKeys(url string, client *http.Client, now func() time.Time, every time.Duration) *remoteKeys {
	if client == nil {
		client = http.DefaultClient
	}
	return &remoteKeys{url: url, client: client, now: now, every: every}
}

// VerifySignature verifies token's signature by the key its kid names (by
// any key of the set if it names none), and returns its payload.
func (r *remoteKeys) VerifySignature(ctx context.Context, token string) ([]byte, error) {
	jws, kid, err := parseJWS(token)
	if err != nil {
		return nil, err
	}
	if payload, ok := r.verify(jws, kid); ok {
		return payload, nil
	}
	ferr := r.refresh(ctx)
	// Whatever refresh said, the set may hold the key now: a fetch that
	// ended between the first look and refresh brought it.
	if payload, ok := r.verify(jws, kid); ok {
		return payload, nil
	}
	if ferr != nil {
		return nil, fmt.Errorf("key %q: %w", kid, ferr)
	}
	return nil, fmt.Errorf("key %q: not in the key set, or the signature is not valid", kid)
}

// verify tries the keys of the set kid names.
func (r *remoteKeys) verify(jws *jose.JSONWebSignature, kid string) ([]byte, bool) {
	r.mu.Lock()
	keys := r.keys
	r.mu.Unlock()
	for i := range keys {
		if kid != "" && keys[i].KeyID != kid {
			continue
		}
		if payload, err := jws.Verify(&keys[i]); err == nil {
			return payload, true
		}
	}
	return nil, false
}

// refresh fetches the set again, or waits on the fetch in progress; within
// every of the last fetch's start it returns ErrRefetchLimited at once.
// The caller who starts a fetch runs it, to its end (fetchTimeout) even if
// its own ctx ends first: others may be waiting on it.
func (r *remoteKeys) refresh(ctx context.Context) error {
	r.mu.Lock()
	f := r.inflight
	if f == nil {
		if !r.fetched.IsZero() && r.now().Sub(r.fetched) < r.every {
			r.mu.Unlock()
			return ErrRefetchLimited
		}
		f = &keysFetch{done: make(chan struct{})}
		r.inflight, r.fetched = f, r.now()
		r.mu.Unlock()
		keys, err := r.fetch(context.WithoutCancel(ctx))
		r.mu.Lock()
		if err == nil {
			r.keys = keys
		}
		r.inflight = nil
		r.mu.Unlock()
		f.err = err
		close(f.done)
		return err
	}
	r.mu.Unlock()
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// fetch reads the set at r.url. Keys of a type or use this host cannot
// verify with are skipped, as an issuer may publish them beside its
// signing keys.
func (r *remoteKeys) fetch(ctx context.Context) ([]jose.JSONWebKey, error) {
	ctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url, nil)
	if err != nil {
		return nil, fmt.Errorf("jwks_url: %w", err)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("jwks_url: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("jwks_url %s: %w", r.url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("jwks_url %s: %s", r.url, resp.Status)
	}
	if len(body) > maxJWKSBytes {
		return nil, fmt.Errorf("jwks_url %s: the key set is over %d bytes", r.url, maxJWKSBytes)
	}
	var raw struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, fmt.Errorf("jwks_url %s: %w", r.url, err)
	}
	var keys []jose.JSONWebKey
	for _, k := range raw.Keys {
		var key jose.JSONWebKey
		if json.Unmarshal(k, &key) != nil || key.Use == "enc" || !key.Valid() {
			continue
		}
		keys = append(keys, key)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("jwks_url %s: no signing key in the set", r.url)
	}
	return keys, nil
}
