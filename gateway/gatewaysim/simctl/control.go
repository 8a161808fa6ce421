package simctl

import (
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardfs/shardfs/clock"
	"github.com/shardfs/shardfs/fsrv"
	"github.com/shardfs/shardfs/gateway/gatewaysim"
	"github.com/shardfs/shardfs/journal"
)

// Usage is what reading /ctl shows: every command Exec accepts, one
// usage line each.
const Usage = `close SHARD|all [CODE]
drop SHARD|all
reconnect SHARD|all
invalidate SHARD|all [resumable]
fault SHARD|all KIND [ARG]
clear SHARD|all
publish SHARD TEXT
traffic PER_SECOND
shards N
guilds N
outgrow N
drain
revoke
restore
`

// verbs are the first words of Usage's lines: the commands Exec takes.
var verbs = func() map[string]bool {
	m := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(Usage), "\n") {
		m[strings.Fields(l)[0]] = true
	}
	return m
}()

// outgrowGuilds is how many guilds per shard outgrow N gives the bot:
// under MaxGuildsPerShard, so that N shards hold them, and close enough
// to it that every shard of a smaller plan (up to 249 shards) holds more.
const outgrowGuilds = 2490

// ErrUsage marks a refused control command; the error says why. It also
// wraps fs.ErrInvalid, which fsrv answers EINVAL.
var ErrUsage = errors.New("refused command")

type usageError struct{ msg string }

func (e *usageError) Error() string   { return e.msg }
func (e *usageError) Unwrap() []error { return []error{ErrUsage, fs.ErrInvalid} }

// Control is the simulator's control surface: the commands of /ctl
// applied to a running simulator, and the /status and /events its tree
// shows.
type Control struct {
	sim    *gatewaysim.Server
	token  string
	clock  clock.Clock
	events *journal.Log

	mu     sync.Mutex // serialises commands, guards the fields below
	shards int        // what discovery recommends
	guilds int
}

// NewControl returns the control surface of sim, which serves token and
// was started with cfg's Shards and Guilds.
func NewControl(sim *gatewaysim.Server, token string) *Control {
	cfg := sim.Config()
	return &Control{sim: sim, token: token, clock: clock.Or(cfg.Clock), events: journal.New(256 << 10),
		shards: cfg.Shards, guilds: cfg.Guilds}
}

// Root is the control tree: ctl (commands, one a line), status (what
// the simulator sees now) and events (every command applied or refused,
// with its reason).
func (c *Control) Root() *fsrv.Dir {
	return fsrv.NewDir("/",
		&fsrv.Ctl{Name: "ctl", Handle: c.Exec, Usage: func() string { return Usage }},
		&fsrv.Text{Name: "status", Content: c.Status},
		&fsrv.LogFile{Name: "events", Source: c.events},
	)
}

// Events is the log behind /events.
func (c *Control) Events() *journal.Log { return c.events }

// Exec applies one command line. A refused line returns an error saying
// why (wrapping ErrUsage) and is logged to /events with that reason, for
// a client over 9P2000.L, whose errors carry an errno alone.
func (c *Control) Exec(line string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	done, err := c.exec(strings.Fields(line))
	if err != nil {
		c.note("rejected", "cmd", line, "err", err.Error())
		return err
	}
	c.note("applied", append([]string{"cmd", line}, done...)...)
	return nil
}

func (c *Control) exec(w []string) (done []string, err error) {
	if len(w) == 0 {
		return nil, usage("empty command")
	}
	if !verbs[w[0]] {
		// Checked against Usage, so that the switch cannot take a
		// command the usage does not list.
		return nil, usage("%q: unknown command", w[0])
	}
	args := w[1:]
	nargs := func(min, max int) error {
		if len(args) < min || len(args) > max {
			if min == max {
				return usage("%s takes %d argument(s)", w[0], min)
			}
			return usage("%s takes %d to %d arguments", w[0], min, max)
		}
		return nil
	}
	inject := func(f gatewaysim.Fault) ([]string, error) {
		id, err := shardArg(args[0])
		if err != nil {
			return nil, err
		}
		n := c.sim.Inject(id, f)
		return []string{"fault", f.String(), "connections", strconv.Itoa(n)}, nil
	}
	switch w[0] {
	case "close":
		if err := nargs(1, 2); err != nil {
			return nil, err
		}
		code := gatewaysim.CloseUnknownError
		if len(args) == 2 {
			if code, err = strconv.Atoi(args[1]); err != nil || code < 1000 || code > 4999 {
				return nil, usage("close code %q: want 1000 to 4999", args[1])
			}
		}
		return inject(gatewaysim.Fault{Kind: gatewaysim.FaultClose, Code: code})
	case "drop":
		if err := nargs(1, 1); err != nil {
			return nil, err
		}
		return inject(gatewaysim.Fault{Kind: gatewaysim.FaultDrop})
	case "reconnect":
		if err := nargs(1, 1); err != nil {
			return nil, err
		}
		return inject(gatewaysim.Fault{Kind: gatewaysim.FaultReconnect})
	case "invalidate":
		if err := nargs(1, 2); err != nil {
			return nil, err
		}
		if len(args) == 2 && args[1] != "resumable" {
			return nil, usage("invalidate: %q: want resumable or nothing", args[1])
		}
		return inject(gatewaysim.Fault{Kind: gatewaysim.FaultInvalidSession, Resumable: len(args) == 2})
	case "fault":
		if err := nargs(2, 3); err != nil {
			return nil, err
		}
		f, err := parseFault(args[1:])
		if err != nil {
			return nil, err
		}
		return inject(f)
	case "clear":
		if err := nargs(1, 1); err != nil {
			return nil, err
		}
		id, err := shardArg(args[0])
		if err != nil {
			return nil, err
		}
		c.sim.ClearFaults(id)
		return nil, nil
	case "publish":
		if len(args) < 2 {
			return nil, usage("publish takes a shard and the message's text")
		}
		id, err := shardArg(args[0])
		if err != nil || id < 0 {
			return nil, usage("publish: %q: want a shard number", args[0])
		}
		data, _ := json.Marshal(map[string]any{
			"id": strconv.FormatInt(c.clock.Now().UnixNano(), 10), "channel_id": "1",
			"content": strings.Join(args[1:], " "), "type": 0,
		})
		n, err := c.sim.Publish(id, gatewaysim.Event{Name: "MESSAGE_CREATE", Data: data})
		if err != nil {
			return nil, usage("publish: %v", err)
		}
		if n == 0 {
			return nil, usage("publish: shard %d has no session to send it to", id)
		}
		return []string{"sessions", strconv.Itoa(n)}, nil
	case "traffic":
		if err := nargs(1, 1); err != nil {
			return nil, err
		}
		r, err := strconv.ParseFloat(args[0], 64)
		if err != nil || r < 0 || r > 10000 {
			return nil, usage("traffic %q: want events per second per shard, 0 to 10000", args[0])
		}
		c.sim.SetTraffic(gatewaysim.Traffic{PerShard: r})
		return nil, nil
	case "shards", "guilds", "outgrow":
		if err := nargs(1, 1); err != nil {
			return nil, err
		}
		most := MaxShards
		if w[0] == "guilds" {
			most *= gatewaysim.MaxGuildsPerShard
		}
		n, err := strconv.Atoi(args[0])
		if err != nil || n < 1 || n > most {
			return nil, usage("%s %q: want 1 to %d", w[0], args[0], most)
		}
		switch w[0] {
		case "shards":
			c.sim.SetShards(n)
			c.shards = n
			return nil, nil
		case "outgrow":
			c.sim.SetShards(n)
			c.shards = n
			n *= outgrowGuilds
		}
		c.guilds = n
		closed := c.sim.SetGuilds(n)
		return []string{"closed_4011", strconv.Itoa(closed)}, nil
	case "drain":
		if err := nargs(0, 0); err != nil {
			return nil, err
		}
		return []string{"connections", strconv.Itoa(c.sim.Drain())}, nil
	case "revoke":
		if err := nargs(0, 0); err != nil {
			return nil, err
		}
		c.sim.SetToken(crand.Text()) // no token a client holds
		return nil, nil
	case "restore":
		if err := nargs(0, 0); err != nil {
			return nil, err
		}
		c.sim.SetToken(c.token)
		return nil, nil
	}
	return nil, usage("%q: unknown command", w[0])
}

// MaxShards bounds shards, guilds and outgrow, so that a typo does not
// make the simulator count a billion guilds.
const MaxShards = 1 << 16

func usage(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...) + "; usage: " + strings.ReplaceAll(strings.TrimSuffix(Usage, "\n"), "\n", " | ")}
}

func shardArg(s string) (int, error) {
	if s == "all" {
		return gatewaysim.AllShards, nil
	}
	id, err := strconv.Atoi(s)
	if err != nil || id < 0 || strconv.Itoa(id) != s {
		return 0, usage("%q: want a shard number or all", s)
	}
	return id, nil
}

// parseFault reads KIND [ARG]: close CODE, invalid-session true|false,
// delay DURATION, oversized BYTES; the other kinds take no argument.
func parseFault(w []string) (gatewaysim.Fault, error) {
	k, err := gatewaysim.ParseFaultKind(w[0])
	if err != nil {
		names := make([]string, 0, 16)
		for _, k := range gatewaysim.FaultKinds() {
			names = append(names, k.String())
		}
		return gatewaysim.Fault{}, usage("fault %q: want one of %s", w[0], strings.Join(names, ", "))
	}
	f := gatewaysim.Fault{Kind: k}
	if len(w) == 1 {
		if k == gatewaysim.FaultDelay {
			return f, usage("fault delay needs a duration such as 2s")
		}
		return f, nil
	}
	arg := w[1]
	switch k {
	case gatewaysim.FaultClose:
		f.Code, err = strconv.Atoi(arg)
		if err == nil && (f.Code < 1000 || f.Code > 4999) {
			err = errors.New("out of range")
		}
	case gatewaysim.FaultInvalidSession:
		f.Resumable, err = strconv.ParseBool(arg)
	case gatewaysim.FaultDelay:
		f.Delay, err = time.ParseDuration(arg)
		if err == nil && (f.Delay < 0 || f.Delay > time.Hour) {
			err = errors.New("out of range")
		}
	case gatewaysim.FaultOversized:
		f.Size, err = strconv.Atoi(arg)
		if err == nil && (f.Size < 1 || f.Size > 64<<20) {
			err = errors.New("out of range")
		}
	default:
		return f, usage("fault %s takes no argument", k)
	}
	if err != nil {
		return f, usage("fault %s: %q: %v", k, arg, err)
	}
	return f, nil
}

// note appends one line to /events.
func (c *Control) note(event string, kv ...string) {
	now := c.clock.Now()
	var b strings.Builder
	b.WriteString("ts=" + now.UTC().Format("2006-01-02T15:04:05.000Z07:00") + " event=" + event)
	for i := 0; i+1 < len(kv); i += 2 {
		v := kv[i+1]
		if v == "" || strings.ContainsAny(v, " \"=\\") || strconv.Quote(v) != `"`+v+`"` {
			v = strconv.Quote(v)
		}
		b.WriteString(" " + kv[i] + "=" + v)
	}
	b.WriteByte('\n')
	c.events.Append([]byte(b.String()), now)
}

// Status is /status: the simulator's endpoints and settings, then one
// line per shard id a client has used.
func (c *Control) Status() []byte {
	c.mu.Lock()
	shards, guilds := c.shards, c.guilds
	c.mu.Unlock()
	cfg := c.sim.Config()
	var b strings.Builder
	fmt.Fprintf(&b, "flavor %s\napi %s\ngateway %s\nshards %d\nguilds %d\nmax_concurrency %d\nconnections %d\naccepted %d\n",
		cfg.Flavor, c.sim.APIURL(), c.sim.GatewayURL(), shards, guilds, cfg.MaxConcurrency, c.sim.Connections(), c.sim.Accepted())
	t := c.sim.Totals()
	fmt.Fprintf(&b, "identifies %d\nresumes %d\nfailed_resumes %d\nlive_sessions %d\n", t.Identifies, t.Resumes, t.FailedResumes, t.LiveSessions)
	for _, id := range c.sim.ShardIDs() {
		st := c.sim.Stats(id)
		var sessions, live int
		for _, s := range c.sim.Sessions(id) {
			sessions++
			if s.Live {
				live++
			}
		}
		fmt.Fprintf(&b, "shard %d sessions %d live %d identifies %d resumes %d failed_resumes %d published %d\n",
			id, sessions, live, st.Identifies, st.Resumes, st.FailedResumes, st.Published)
	}
	return []byte(b.String())
}
