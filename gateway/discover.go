package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
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
	body, closeBody, err := apiGet(ctx, client, flavor, api, "/gateway/bot", token)
	if err != nil {
		return Discovery{}, &discoveryError{err}
	}
	defer closeBody()
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

// apiGet sends an authenticated GET {api}{path} (api: DiscordAPI or
// FluxerAPI when empty) and returns the body of a 200 answer, bounded to
// 64 KiB, and the function that closes it. The token goes only into the
// Authorization header, and only over https or to loopback; no error ever
// quotes it. A nil client means http.DefaultClient.
func apiGet(ctx context.Context, client *http.Client, flavor core.Flavor, api, path, token string) (io.Reader, func(), error) {
	if client == nil {
		client = http.DefaultClient
	}
	if api == "" {
		api = DiscordAPI
		if flavor == core.Fluxer {
			api = FluxerAPI
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(api, "/")+path, nil)
	if err != nil {
		return nil, nil, err
	}
	if req.URL.Scheme != "https" && !(req.URL.Scheme == "http" && plainOK(req.URL.Hostname())) {
		return nil, nil, fmt.Errorf("refusing to send the token to %s://%s; use https", req.URL.Scheme, req.URL.Host)
	}
	req.Header.Set("Authorization", "Bot "+bareToken(token))
	req.Header.Set("User-Agent", userAgent)
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		resp.Body.Close()
		return nil, nil, fmt.Errorf("answered %s: %w", resp.Status, ErrUnauthorized)
	case resp.StatusCode != http.StatusOK:
		resp.Body.Close()
		return nil, nil, fmt.Errorf("answered %s", resp.Status)
	}
	return io.LimitReader(resp.Body, 64<<10), func() { resp.Body.Close() }, nil
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
	t.url, t.urlAt, t.trusted = d.URL, t.clock.Now(), d.URL
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

// discoveryFailed is a connection's failure for err, what gatewayURL
// returned: transient, unless the token was refused.
func discoveryFailed(err error) *connError {
	f := transient(faultDiscovery, fmt.Errorf("discovery: %w", err))
	if errors.Is(err, ErrUnauthorized) {
		f.class = core.FatalFailure
	}
	return f
}

// errUntrustedResume marks a resume URL that the token may not go to.
var errUntrustedResume = errors.New("resume_gateway_url is not under the gateway's domain")

// maxRefusedHosts bounds the hosts whose refusal is remembered, so that a
// gateway naming a new host in every READY cannot grow the transport or
// its log without end.
const maxRefusedHosts = 64

// checkResume decides whether a resume may go to raw, the session's resume
// URL (READY's resume_gateway_url, or the URL a Fluxer session connected
// to). The Resume carries the token, so it goes only to the gateway the
// client would identify at: the same host as the configured or last
// discovered gateway URL, or a wss:// host under that host's registrable
// domain (gateway-us-east1-b.discord.gg under gateway.discord.gg's
// discord.gg); a loopback host only when the gateway is on loopback too
// (the simulator, a local proxy). Anything else is a NewSession failure:
// the core identifies afresh, at the discovered URL. Each refused host is
// logged once per transport, not once per attempt.
func (t *Transport) checkResume(ctx context.Context, raw string) error {
	if raw == "" {
		return nil
	}
	ref := t.cfg.GatewayURL
	if ref == "" {
		t.dmu.Lock()
		ref = t.trusted
		t.dmu.Unlock()
		if ref == "" {
			// A session this process never discovered for (one restored
			// from elsewhere): the gateway it belongs to must be known
			// first.
			if _, err := t.gatewayURL(ctx); err != nil {
				return discoveryFailed(err)
			}
			t.dmu.Lock()
			ref = t.trusted
			t.dmu.Unlock()
		}
	}
	g, err := url.Parse(ref)
	if err != nil {
		return &connError{class: core.NewSession, fault: faultDiscovery, err: fmt.Errorf("%w: the gateway URL does not parse", errUntrustedResume)}
	}
	u, err := wsURL(raw)
	if err == nil && resumeTrusted(u, g) {
		return nil
	}
	host := "an unparsable URL"
	if err == nil {
		host = u.Scheme + "://" + u.Host
	}
	t.dmu.Lock()
	_, seen := t.refused[host]
	if !seen && len(t.refused) < maxRefusedHosts {
		if t.refused == nil {
			t.refused = make(map[string]struct{})
		}
		t.refused[host] = struct{}{}
	} else {
		seen = true
	}
	t.dmu.Unlock()
	if !seen {
		t.log.Warn("gateway: refusing to resume at a host outside the gateway's domain; starting new sessions instead", "resume_host", host, "gateway", g.Host)
	}
	return &connError{class: core.NewSession, fault: faultDiscovery, err: fmt.Errorf("%w (%s, gateway %s): starting a new session", errUntrustedResume, host, g.Host)}
}

// resumeTrusted reports whether a resume at u may carry the token of a
// session of the gateway g (see checkResume).
func resumeTrusted(u, g *url.URL) bool {
	if g.Scheme == "wss" && u.Scheme != "wss" {
		return false // never drop TLS
	}
	host, gh := canonicalHost(u.Hostname()), canonicalHost(g.Hostname())
	switch {
	case host == "" || gh == "":
		return false
	case host == gh:
		return true
	case plainOK(host):
		return plainOK(gh)
	case u.Scheme != "wss" || net.ParseIP(host) != nil || net.ParseIP(gh) != nil:
		return false
	}
	d := registrableDomain(gh)
	return host == d || strings.HasSuffix(host, "."+d)
}

func canonicalHost(h string) string { return strings.ToLower(strings.TrimSuffix(h, ".")) }

// registrableDomain returns the part of a DNS name its owner registered:
// the last two labels (discord.gg, fluxer.app), or the last three when the
// top-level label is a two-letter country code and the one before it has
// at most three letters (example.co.uk, example.com.au). The public suffix
// list (golang.org/x/net/publicsuffix) would be exact; this rule keeps the
// module free of it. Where it errs it is mostly strict (gateway.abc.io
// counts as its own domain, so a resume at us.abc.io starts a new
// session); it would trust too much only under a suffix that the list
// names and this rule cannot know (a gateway discovered at
// x.github.io would trust all of github.io). The discovered host is the
// platform's own, named by its HTTPS API, which keeps that case
// theoretical. A name of one or two labels is its own domain.
func registrableDomain(host string) string {
	labels := strings.Split(host, ".")
	n := 2
	if len(labels) >= 3 && len(labels[len(labels)-1]) == 2 && len(labels[len(labels)-2]) <= 3 {
		n = 3
	}
	if len(labels) <= n {
		return host
	}
	return strings.Join(labels[len(labels)-n:], ".")
}
