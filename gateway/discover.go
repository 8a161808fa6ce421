package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/shardfs/shardfs/core"
)

// ErrUnauthorized means the platform refused the token (HTTP 401 or 403):
// retrying with the same token cannot help.
var ErrUnauthorized = errors.New("gateway: the token was refused")

// Discovery is the answer of GET {api}/gateway/bot.
type Discovery struct {
	// URL is the gateway's WebSocket URL, without query.
	URL string
	// Shards is the recommended shard count (Fluxer: always 1).
	Shards int
	// StartLimit is Discord's session_start_limit. Fluxer reports constants
	// that must not be paced from; they are returned as sent.
	StartLimit core.StartLimit
}

// Default API bases.
const (
	DiscordAPI = "https://discord.com/api/v10"
	FluxerAPI  = "https://api.fluxer.app/v1"
)

// userAgent follows Discord's required form for bots.
const userAgent = "DiscordBot (https://github.com/shardfs/shardfs, 1)"

// Discover asks the platform at api (DiscordAPI or FluxerAPI when empty)
// for the gateway URL, the recommended shard count and the session start
// limit. The token goes only into the Authorization header; no error ever
// quotes it. A nil client means http.DefaultClient.
func Discover(ctx context.Context, client *http.Client, flavor core.Flavor, api, token string) (Discovery, error) {
	if client == nil {
		client = http.DefaultClient
	}
	if api == "" {
		api = DiscordAPI
		if flavor == core.Fluxer {
			api = FluxerAPI
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(api, "/")+"/gateway/bot", nil)
	if err != nil {
		return Discovery{}, &discoveryError{err}
	}
	if req.URL.Scheme != "https" && !(req.URL.Scheme == "http" && plainOK(req.URL.Hostname())) {
		return Discovery{}, &discoveryError{fmt.Errorf("refusing to send the token to %s://%s; use https", req.URL.Scheme, req.URL.Host)}
	}
	req.Header.Set("Authorization", "Bot "+bareToken(token))
	req.Header.Set("User-Agent", userAgent)
	resp, err := client.Do(req)
	if err != nil {
		return Discovery{}, &discoveryError{err}
	}
	defer resp.Body.Close()
	body := io.LimitReader(resp.Body, 64<<10)
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return Discovery{}, &discoveryError{fmt.Errorf("answered %s: %w", resp.Status, ErrUnauthorized)}
	case resp.StatusCode != http.StatusOK:
		return Discovery{}, &discoveryError{fmt.Errorf("answered %s", resp.Status)}
	}
	var v struct {
		URL               string `json:"url"`
		Shards            int    `json:"shards"`
		SessionStartLimit struct {
			Total          int   `json:"total"`
			Remaining      int   `json:"remaining"`
			ResetAfter     int64 `json:"reset_after"`
			MaxConcurrency int   `json:"max_concurrency"`
		} `json:"session_start_limit"`
	}
	if err := json.NewDecoder(body).Decode(&v); err != nil {
		return Discovery{}, &discoveryError{fmt.Errorf("malformed answer: %w", err)}
	}
	if !strings.HasPrefix(v.URL, "ws://") && !strings.HasPrefix(v.URL, "wss://") {
		return Discovery{}, &discoveryError{errors.New("the answer has no ws:// or wss:// url")}
	}
	l := v.SessionStartLimit
	return Discovery{
		URL:    v.URL,
		Shards: v.Shards,
		StartLimit: core.StartLimit{
			Total: l.Total, Remaining: l.Remaining,
			ResetAfter:     time.Duration(l.ResetAfter) * time.Millisecond,
			MaxConcurrency: l.MaxConcurrency,
		},
	}, nil
}

// discoveryError is a failed discovery. Its text says "gateway:
// discovery:" once; a shard's connection, whose error says "discovery:"
// itself, reports only the reason (gatewayURL unwraps it).
type discoveryError struct{ err error }

func (e *discoveryError) Error() string { return "gateway: discovery: " + e.err.Error() }
func (e *discoveryError) Unwrap() error { return e.err }

// bareToken drops an HTTP "Bot " prefix: identify and resume send the raw
// token, the HTTP API the prefixed one.
func bareToken(t string) string { return strings.TrimPrefix(t, "Bot ") }

// Discover fetches the gateway URL anew, caches it for connections and
// hands Discord's session start limit to Config.OnStartLimit. The binary
// calls it once before starting the node, for --total auto.
func (t *Transport) Discover(ctx context.Context) (Discovery, error) {
	d, err := Discover(ctx, t.cfg.HTTPClient, t.cfg.Flavor, t.cfg.API, t.cfg.Token)
	if err != nil {
		return d, err
	}
	t.dmu.Lock()
	t.url, t.urlAt = d.URL, t.clock.Now()
	t.dmu.Unlock()
	if t.cfg.Flavor == core.Discord {
		t.gate.setMaxConcurrency(max(d.StartLimit.MaxConcurrency, 1))
		if t.cfg.OnStartLimit != nil {
			t.cfg.OnStartLimit(d.StartLimit)
		}
	}
	return d, nil
}

// gatewayURL returns the URL to connect to: the configured one, or the
// cached discovery, refreshed when it is missing or older than
// DiscoveryMaxAge. Concurrent callers share one request.
func (t *Transport) gatewayURL(ctx context.Context) (string, error) {
	if t.cfg.GatewayURL != "" {
		return t.cfg.GatewayURL, nil
	}
	for {
		t.dmu.Lock()
		if t.url != "" && t.clock.Now().Sub(t.urlAt) < t.cfg.DiscoveryMaxAge {
			u := t.url
			t.dmu.Unlock()
			return u, nil
		}
		if wait := t.discovering; wait != nil {
			t.dmu.Unlock()
			select {
			case <-wait:
			case <-ctx.Done():
				return "", ctx.Err()
			}
			t.dmu.Lock()
			u, err := t.url, t.discoverErr
			t.dmu.Unlock()
			if u != "" {
				return u, nil
			}
			if err != nil && !errors.Is(err, context.Canceled) {
				return "", err
			}
			continue // the caller that asked gave up: ask again
		}
		done := make(chan struct{})
		t.discovering = done
		t.dmu.Unlock()

		_, err := t.Discover(ctx)
		if de, ok := err.(*discoveryError); ok {
			err = de.err
		}
		t.dmu.Lock()
		t.discovering, t.discoverErr = nil, err
		u := t.url
		t.dmu.Unlock()
		close(done)
		if err != nil {
			return "", err
		}
		return u, nil
	}
}

// forgetURL drops a cached URL that failed to connect, so that the next
// connection discovers again, as Discord asks.
func (t *Transport) forgetURL(u string) {
	t.dmu.Lock()
	if t.url == u {
		t.url = ""
	}
	t.dmu.Unlock()
}
