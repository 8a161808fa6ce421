package gateway

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/core/coretest"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/shardfs"
	"github.com/shardfs/shardfs/wire"
)

// A dispatch with bytes that are not UTF-8 reaches the sink with each run
// of them replaced by U+FFFD: a line of /dispatch is always JSON in UTF-8.
func TestParsePayloadUTF8(t *testing.T) {
	for _, tc := range []struct{ in, name, d string }{
		{"{\"op\":0,\"s\":1,\"t\":\"MESSAGE_CREATE\",\"d\":{\"content\":\"caf\xe9 \xff\xfe!\"}}", "MESSAGE_CREATE", "{\"content\":\"caf\uFFFD \uFFFD!\"}"},
		{"{\"op\":0,\"s\":1,\"t\":\"X\xc0\",\"d\":[\"\xed\xa0\x80\"]}", "X\uFFFD", "[\"\uFFFD\"]"},
		{"{\"op\":0,\"s\":1,\"t\":\"OK\",\"d\":\"\u00e9\U0001F600\"}", "OK", "\"\u00e9\U0001F600\""},
	} {
		p, err := parsePayload([]byte(tc.in))
		if err != nil {
			t.Errorf("parsePayload(%q) = %v", tc.in, err)
			continue
		}
		if string(p.name) != tc.name || string(p.d) != tc.d {
			t.Errorf("parsePayload(%q) = t %q d %q; want %q %q", tc.in, p.name, p.d, tc.name, tc.d)
		}
	}
}

// The gateway's invalid UTF-8 does not fail the connection: the sink gets
// the event, repaired, and the shard stays READY.
func TestInvalidUTF8Dispatch(t *testing.T) {
	e := newEnv(t, envConfig{})
	e.start()
	before := e.diag(0)
	if _, err := e.sim.Publish(0, gatewaysim.Event{Name: "MESSAGE_CREATE", Data: []byte("{\"content\":\"caf\xe9\"}")}); err != nil {
		t.Fatal(err)
	}
	e.synced(0)
	got := e.sink.get(0)
	last := got[len(got)-1]
	if last.name != "MESSAGE_CREATE" || last.d != "{\"content\":\"caf\uFFFD\"}" {
		t.Errorf("sink got %s %q; want MESSAGE_CREATE with U+FFFD for the bad byte", last.name, last.d)
	}
	if d := e.diag(0); d.State != core.Ready || d.Reconnects != before.Reconnects {
		t.Errorf("state %v, reconnects %d -> %d; want READY, none", d.State, before.Reconnects, d.Reconnects)
	}
}

// A binary frame on a connection that is not compressed is a protocol
// error, as a text frame inside a compressed stream is: it is not
// delivered, and the shard resumes.
func TestBinaryFrameUncompressed(t *testing.T) {
	for _, flavor := range []core.Flavor{core.Discord, core.Fluxer} {
		t.Run(flavor.String(), func(t *testing.T) {
			e := newEnv(t, envConfig{flavor: flavor})
			e.start()
			before := e.diag(0)
			m := e.mark(0)
			e.sim.Inject(0, gatewaysim.Fault{Kind: gatewaysim.FaultBinaryJSON})
			off := e.waitBackoff(0, m)
			if line := logText(e.events(0), m)[:off-m]; !strings.Contains(line, "binary frame") {
				t.Errorf("backoff line %q; want it to name the binary frame", line)
			}
			e.simWait("the old connection to end", func() bool { return e.sim.Stats(0).LiveSessions == 0 })
			e.clk.Advance(5 * time.Second)
			e.waitEvent(0, off, "resumed")
			e.synced(0)
			for _, ev := range e.sink.get(0) {
				if strings.Contains(ev.d, "binary frame") {
					t.Errorf("the sink got the binary frame's dispatch: %q", ev.d)
				}
			}
			if d := e.diag(0); d.Epoch != before.Epoch || d.Reconnects != before.Reconnects+1 {
				t.Errorf("epoch %d -> %d, reconnects %d -> %d; want one reconnect and a resume", before.Epoch, d.Epoch, before.Reconnects, d.Reconnects)
			}
		})
	}
}

// FuzzDispatchLine: any payload the client accepts as a dispatch becomes
// a /dispatch line (built by shardfs.Tree, the binary's sink) that
// encoding/json and utf8.Valid accept.
func FuzzDispatchLine(f *testing.F) {
	for _, s := range []string{
		`{"op":0,"s":1,"t":"MESSAGE_CREATE","d":{"content":"hi"}}`,
		"{\"op\":0,\"s\":2,\"t\":\"MESSAGE_CREATE\",\"d\":{\"content\":\"caf\xe9\"}}",
		"{\"op\":0,\"s\":3,\"t\":\"\xff\",\"d\":\"\xc0\xaf\"}",
		`{"op":0,"s":4,"t":"A\u005fB","d":"\ud800"}`,
		"{\"op\":0,\"t\":\"READY\",\"d\":{\"session_id\":\"x\xff\",\"v\":10}}",
		"{\"op\":0,\"s\":5,\"t\":\"E\",\"d\":{\n\"a\" : [1,\n2]}}",
	} {
		f.Add([]byte(s))
	}
	node, err := core.New(core.Config{Plan: core.Range(1, 0, 0), Transport: &coretest.Transport{}, Clock: clock.NewFake()})
	if err != nil {
		f.Fatal(err)
	}
	defer node.Close()
	tree := shardfs.New(shardfs.Config{Scheduler: node, DispatchRetention: 1 << 20})
	log := tree.DispatchLog(0)
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parsePayload(b)
		if err != nil || p.op != opDispatch {
			return
		}
		// The name and d as conn.dispatch and conn.ready hand them over.
		name := string(p.name)
		if p.nameEscaped {
			name, _ = wire.String(append(append([]byte{'"'}, p.name...), '"'))
		}
		d := p.d
		if name == "READY" {
			d = redactReady(d)
		}
		from := log.Size()
		tree.Dispatch(0, "a1b2c3d4e5f6", p.seq, name, d)
		line := make([]byte, log.Size()-from)
		n, _ := log.ReadAt(line, from)
		line = bytes.TrimSuffix(line[:n], []byte("\n"))
		if !utf8.Valid(line) || !json.Valid(line) || bytes.IndexByte(line, '\n') >= 0 {
			t.Fatalf("frame %q made the /dispatch line %q: not one line of JSON in UTF-8", b, line)
		}
	})
}
