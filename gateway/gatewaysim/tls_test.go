package gatewaysim

import (
	"crypto/tls"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/gorilla/websocket"
)

// TestTLS serves discovery and the gateway over TLS, as the real platforms
// do: the URLs say https:// and wss://, so that a client that follows them
// (discovery's url, READY's resume_gateway_url) stays on TLS.
func TestTLS(t *testing.T) {
	cert, pool, err := SelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	tc := &tls.Config{RootCAs: pool}

	for _, flavor := range flavors {
		t.Run(flavor.String(), func(t *testing.T) {
			srv, _ := newTestServer(t, Config{Flavor: flavor, TLS: &tls.Config{Certificates: []tls.Certificate{cert}}})
			for _, u := range []string{srv.APIURL(), srv.GatewayURL(), srv.ResumeURL()} {
				if !strings.HasPrefix(u, "https://") && !strings.HasPrefix(u, "wss://") {
					t.Errorf("URL %q; want https:// or wss://", u)
				}
			}

			hc := &http.Client{Timeout: netWait, Transport: &http.Transport{TLSClientConfig: tc}}
			defer hc.CloseIdleConnections()
			req, _ := http.NewRequest("GET", srv.APIURL()+"/gateway/bot", nil)
			req.Header.Set("Authorization", "Bot sim-token")
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatalf("discovery over TLS: %v", err)
			}
			var body struct {
				URL string `json:"url"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if body.URL != srv.GatewayURL() {
				t.Errorf("discovery url = %q; want %q", body.URL, srv.GatewayURL())
			}

			q := "?v=10&encoding=json"
			if flavor == Fluxer {
				q = "?v=1&encoding=json"
			}
			d := websocket.Dialer{HandshakeTimeout: netWait, TLSClientConfig: tc}
			ws, resp, err := d.Dial(body.URL+q, nil)
			if err != nil {
				t.Fatalf("Dial(%s) over TLS: %v", body.URL, err)
			}
			resp.Body.Close()
			defer ws.Close()
			if _, ok := ws.UnderlyingConn().(*tls.Conn); !ok {
				t.Fatalf("the gateway connection is a %T; want *tls.Conn", ws.UnderlyingConn())
			}
			c := &testClient{t: t, ws: ws}
			c.expect(opHello, "")
			c.identify(identifyOpts{shard: []int{0, 1}, intents: IntentGuilds})
			var r readyData
			if err := json.Unmarshal(c.expect(opDispatch, "READY").D, &r); err != nil {
				t.Fatal(err)
			}
			if flavor == Discord && r.ResumeGatewayURL != srv.ResumeURL() {
				t.Errorf("READY resume_gateway_url = %q; want %q", r.ResumeGatewayURL, srv.ResumeURL())
			}
		})
	}
}
