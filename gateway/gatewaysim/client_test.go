package gatewaysim

import (
	"bytes"
	"compress/zlib"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/klauspost/compress/zstd"
	"github.com/shardfs/shardfs/clock"
)

// netWait bounds every wait on the network; a test never sleeps. Only a
// hang reaches it, so it is generous: on a loaded machine under -race,
// building and compressing the oversized fault's 10 MiB took over 5 s.
const netWait = 60 * time.Second

// gwFrame is a gateway payload as a client sees it.
type gwFrame struct {
	Op int             `json:"op"`
	S  *int64          `json:"s"`
	T  string          `json:"t"`
	D  json.RawMessage `json:"d"`
}

func (f gwFrame) seq() int64 {
	if f.S == nil {
		return -1
	}
	return *f.S
}

// testClient is a minimal gateway client written from the platforms'
// documentation, independent of package gateway.
type testClient struct {
	t        testing.TB
	ws       *websocket.Conn
	compress string // "", "zlib-stream" or "zstd-stream"
	stream   bool   // Fluxer stream=1: client payloads are zstd too

	// Compressed connections: every message so far, and how much of their
	// decompressed stream earlier payloads used.
	messages [][]byte
	history  []byte
	used     int

	zout *zstd.Encoder
	zbuf bytes.Buffer
}

func dialQuery(t testing.TB, url, query string) *testClient {
	t.Helper()
	d := websocket.Dialer{HandshakeTimeout: netWait}
	ws, resp, err := d.Dial(url+"?"+query, nil)
	if err != nil {
		t.Fatalf("Dial(%s?%s) = %v", url, query, err)
	}
	resp.Body.Close()
	c := &testClient{t: t, ws: ws}
	for _, kv := range strings.Split(query, "&") {
		switch kv {
		case "compress=zlib-stream":
			c.compress = "zlib-stream"
		case "compress=zstd-stream":
			c.compress = "zstd-stream"
		case "stream=1":
			c.stream = true
		}
	}
	c.stream = c.stream && c.compress == "zstd-stream"
	t.Cleanup(func() { ws.Close() })
	return c
}

// dial connects to the server's gateway with the flavor's usual query.
func dial(t testing.TB, srv *Server, extra string) *testClient {
	t.Helper()
	q := "v=10&encoding=json"
	if srv.Flavor() == Fluxer {
		q = "v=1&encoding=json"
	}
	if extra != "" {
		q += "&" + extra
	}
	return dialQuery(t, srv.GatewayURL(), q)
}

// raw reads one WebSocket message as it came.
func (c *testClient) raw() (int, []byte, error) {
	_ = c.ws.SetReadDeadline(time.Now().Add(netWait))
	return c.ws.ReadMessage()
}

// next reads one gateway payload, decompressing as negotiated.
func (c *testClient) next() (gwFrame, error) {
	var f gwFrame
	mt, msg, err := c.raw()
	if err != nil {
		return f, err
	}
	if c.compress == "" {
		if mt != websocket.TextMessage {
			return f, fmt.Errorf("binary frame % x", msg)
		}
		return f, json.Unmarshal(msg, &f)
	}
	if mt != websocket.BinaryMessage {
		return f, fmt.Errorf("text frame %q on a compressed connection", msg)
	}
	p, err := c.decompress(msg)
	if err != nil {
		return f, err
	}
	return f, json.Unmarshal(p, &f)
}

// decompress returns the payload one message adds to the connection's
// compressed stream. It decompresses the whole stream again each time:
// slow, but it needs no knowledge of where a decoder stops reading, so it
// checks that every message ends exactly where a payload ends.
func (c *testClient) decompress(msg []byte) ([]byte, error) {
	c.messages = append(c.messages, msg)
	c.history = append(c.history, msg...)
	var r io.Reader
	if c.compress == "zlib-stream" {
		zr, err := zlib.NewReader(bytes.NewReader(c.history))
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		r = zr
	} else {
		// MultiReader hides the bytes.Reader, which would make the decoder
		// insist on a complete frame.
		zr, err := zstd.NewReader(io.MultiReader(bytes.NewReader(c.history)), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		r = zr
	}
	out, err := io.ReadAll(r)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, err
	}
	if len(out) < c.used {
		return nil, errors.New("decompressed stream shrank")
	}
	p := out[c.used:]
	c.used = len(out)
	return p, nil
}

// expect reads the next payload and checks its opcode (and name for op 0).
func (c *testClient) expect(op int, name string) gwFrame {
	c.t.Helper()
	f, err := c.next()
	if err != nil {
		c.t.Fatalf("waiting for op %d %s: %v", op, name, err)
	}
	if f.Op != op || name != "" && f.T != name {
		c.t.Fatalf("got op %d %s (d=%s); want op %d %s", f.Op, f.T, f.D, op, name)
	}
	return f
}

// expectClose reads until the server's close frame and checks its code,
// skipping dispatches that were already on their way.
func (c *testClient) expectClose(code int) {
	c.t.Helper()
	for range 100000 {
		f, err := c.next()
		if err == nil {
			if f.Op != opDispatch && f.Op != opHeartbeatACK {
				c.t.Fatalf("got op %d while waiting for close %d", f.Op, code)
			}
			continue
		}
		var ce *websocket.CloseError
		if !errors.As(err, &ce) {
			c.t.Fatalf("got %v; want close %d", err, code)
		}
		if ce.Code != code {
			c.t.Fatalf("closed with %d %q; want %d", ce.Code, ce.Text, code)
		}
		return
	}
	c.t.Fatalf("no close %d", code)
}

func (c *testClient) send(v any) {
	c.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		c.t.Fatal(err)
	}
	c.sendRaw(b)
}

func (c *testClient) sendRaw(b []byte) {
	c.t.Helper()
	mt := websocket.TextMessage
	if c.stream {
		if c.zout == nil {
			c.zout, _ = zstd.NewWriter(&c.zbuf, zstd.WithEncoderConcurrency(1))
		}
		c.zbuf.Reset()
		c.zout.Write(b)
		c.zout.Flush()
		b, mt = c.zbuf.Bytes(), websocket.BinaryMessage
	}
	_ = c.ws.SetWriteDeadline(time.Now().Add(netWait))
	if err := c.ws.WriteMessage(mt, b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

type identifyOpts struct {
	token   string
	shard   []int
	intents any
}

func (c *testClient) identify(o identifyOpts) {
	c.t.Helper()
	if o.token == "" {
		o.token = "sim-token"
	}
	d := map[string]any{
		"token":      o.token,
		"properties": map[string]string{"os": "linux", "browser": "gatewaysim-test", "device": "gatewaysim-test"},
	}
	if o.shard != nil {
		d["shard"] = o.shard
	}
	if o.intents != nil {
		d["intents"] = o.intents
	}
	c.send(map[string]any{"op": opIdentify, "d": d})
}

func (c *testClient) heartbeat(seq int64) {
	c.t.Helper()
	var d any
	if seq >= 0 {
		d = seq
	}
	c.send(map[string]any{"op": opHeartbeat, "d": d})
}

func (c *testClient) resume(sessionID string, seq int64) {
	c.t.Helper()
	c.send(map[string]any{"op": opResume, "d": map[string]any{"token": "sim-token", "session_id": sessionID, "seq": seq}})
}

type readyData struct {
	SessionID        string `json:"session_id"`
	ResumeGatewayURL string `json:"resume_gateway_url"`
	Shard            []int  `json:"shard"`
	Guilds           []struct {
		ID          string `json:"id"`
		Unavailable bool   `json:"unavailable"`
	} `json:"guilds"`
}

// start identifies and reads READY and the GUILD_CREATEs that follow.
func (c *testClient) start(srv *Server, shardID, total int) (readyData, int64) {
	c.t.Helper()
	c.expect(opHello, "")
	c.identify(identifyOpts{shard: []int{shardID, total}, intents: IntentGuilds | IntentGuildMessages | IntentDirectMessages})
	f := c.expect(opDispatch, "READY")
	var r readyData
	if err := json.Unmarshal(f.D, &r); err != nil {
		c.t.Fatal(err)
	}
	seq := f.seq()
	for range srv.Guilds(shardID, total) {
		seq = c.expect(opDispatch, "GUILD_CREATE").seq()
	}
	return r, seq
}

// closeWith closes the connection from the client side with a code.
func (c *testClient) closeWith(code int) {
	_ = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, ""), time.Now().Add(netWait))
	c.ws.Close()
}

// newTestServer starts a server on a fake clock unless cfg has a clock.
func newTestServer(t testing.TB, cfg Config) (*Server, *clock.Fake) {
	t.Helper()
	fc, _ := cfg.Clock.(*clock.Fake)
	if cfg.Clock == nil {
		fc = clock.NewFake()
		cfg.Clock = fc
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv, fc
}

// waitFor waits at the network boundary for a server state.
func waitFor(t testing.TB, srv *Server, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), netWait)
	defer cancel()
	if err := srv.Wait(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func getJSON(t testing.TB, url, auth string, v any) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	client := http.Client{Timeout: netWait}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if v != nil {
		_ = json.NewDecoder(resp.Body).Decode(v)
	}
	client.CloseIdleConnections()
	return resp.StatusCode
}
