package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

// sessionSpy records the session ids the core hands to resume attempts,
// so that a test can look for them where they must not be.
type sessionSpy struct {
	core.Transport
	mu  sync.Mutex
	ids map[string]bool
}

func (s *sessionSpy) Connect(l *core.Link, a core.Attempt) core.Conn {
	if a.Session.ID != "" {
		s.mu.Lock()
		s.ids[a.Session.ID] = true
		s.mu.Unlock()
	}
	return s.Transport.Connect(l, a)
}

// TestSecrets runs shards through identify, resume, a new session and a
// fatal close with a recognisable token, then looks for the token and the
// session ids in everything a user or an operator can see: logs, events,
// diagnostics, errors and the sink's dispatches.
func TestSecrets(t *testing.T) {
	const token = "SECRET-t0ken.Zx9-8f2b6a1c4d7e"
	for _, v := range []struct {
		name     string
		flavor   core.Flavor
		compress Compression
	}{{"discord", core.Discord, ZlibStream}, {"fluxer", core.Fluxer, ZstdStream}} {
		t.Run(v.name, func(t *testing.T) {
			spy := &sessionSpy{ids: map[string]bool{}}
			e := newEnv(t, envConfig{flavor: v.flavor, compress: v.compress, shards: 2, token: token,
				wrap: func(tr core.Transport) core.Transport { spy.Transport = tr; return spy }})
			e.start()
			e.publish(0, 2)
			e.synced(0)

			m := e.drop(0)
			e.clk.Advance(5 * time.Second)
			e.waitEvent(0, m, "resumed")

			m = e.mark(1)
			e.sim.Inject(1, gatewaysim.Fault{Kind: gatewaysim.FaultInvalidSession})
			if v.flavor == core.Fluxer {
				e.waitEvent(1, m, "ready")
			} else {
				e.waitBackoff(1, m)
				e.clk.Advance(5 * time.Second)
				e.waitEvent(1, m, "ready")
			}
			m = e.mark(1)
			e.sim.Inject(1, gatewaysim.Fault{Kind: gatewaysim.FaultClose, Code: 4004})
			e.waitEvent(1, m, "fatal")

			var seen strings.Builder
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			_, err := Discover(ctx, nil, v.flavor, e.sim.APIURL(), token+"-wrong")
			fmt.Fprintln(&seen, err)
			cfg := e.tr.cfg
			fmt.Fprintf(&seen, "%v %+v %#v %s\n", cfg, cfg, cfg, cfg)
			slog.New(slog.NewTextHandler(&seen, nil)).Info("config", "cfg", cfg)
			seen.WriteString(e.logs.String())
			seen.WriteString(logText(e.node.Events(), 0))
			for id := range 2 {
				d := e.diag(id)
				seen.Write(d.AppendText(nil, e.clk.Now()))
				fmt.Fprintln(&seen, d.LastError)
				for _, ev := range e.sink.get(id) {
					fmt.Fprintln(&seen, ev.name, ev.d)
				}
			}
			text := seen.String()
			if strings.Contains(text, token) {
				t.Errorf("the token appears in what users see:\n%s", text)
			}
			if len(spy.ids) == 0 {
				t.Fatal("no session id was captured; the check would prove nothing")
			}
			for id := range spy.ids {
				if strings.Contains(text, id) {
					t.Errorf("session id %s appears in what users see", id)
				}
			}
			if !strings.Contains(text, `"session_id":"redacted"`) {
				t.Errorf("READY reached the sink without its session_id redacted")
			}
		})
	}
}
