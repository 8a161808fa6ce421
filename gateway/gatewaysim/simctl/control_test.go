package simctl

import (
	"errors"
	"io/fs"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/shardfs/shardfs/gateway/gatewaysim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newControl(t *testing.T, cfg gatewaysim.Config) (*gatewaysim.Server, *Control) {
	t.Helper()
	cfg.Token = "tok"
	sim, err := gatewaysim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim, NewControl(sim, "tok")
}

// instance fills a usage line's placeholders with values the command
// takes.
func instance(line string) string {
	r := strings.NewReplacer("SHARD|all", "all", "[CODE]", "4000", "[resumable]", "resumable",
		"KIND [ARG]", "delay 1s", "SHARD TEXT", "0 hello", "PER_SECOND", "2", " N", " 3")
	return r.Replace(line)
}

// Every usage line is a command Exec takes, and Exec takes no command
// the usage does not list.
func TestUsageListsEveryCommand(t *testing.T) {
	_, c := newControl(t, gatewaysim.Config{})
	for _, line := range strings.Split(strings.TrimSpace(Usage), "\n") {
		cmd := instance(line)
		err := c.Exec(cmd)
		if strings.HasPrefix(cmd, "publish ") {
			// No session to publish to: refused for that, not as unknown.
			if err == nil || !strings.Contains(err.Error(), "no session") {
				t.Errorf("Exec(%q) = %v; want the no-session refusal", cmd, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("Exec(%q), from usage line %q = %v", cmd, line, err)
		}
	}
	for verb := range verbs {
		if !strings.Contains("\n"+Usage, "\n"+verb) {
			t.Errorf("verb %q is not in the usage", verb)
		}
	}
	if err := c.Exec("frobnicate 1"); !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "unknown command") {
		t.Errorf("Exec(frobnicate 1) = %v; want unknown command", err)
	}
}

// A refused command returns why, as an error fsrv answers EINVAL, and
// /events says it too; an applied one is logged with what it did.
func TestRefusalsSayWhy(t *testing.T) {
	_, c := newControl(t, gatewaysim.Config{})
	for _, tc := range []struct{ line, reason string }{
		{"", "empty command"},
		{"close", "close takes 1 to 2 arguments"},
		{"close -1", `"-1": want a shard number or all`},
		{"close 0 99", `close code "99": want 1000 to 4999`},
		{"invalidate 0 maybe", `want resumable or nothing`},
		{"fault 0 smoke", `fault "smoke": want one of close, `},
		{"fault 0 drop 3", "fault drop takes no argument"},
		{"fault 0 delay", "needs a duration"},
		{"traffic fast", `traffic "fast"`},
		{"shards 0", `shards "0": want 1 to 65536`},
		{"publish all hi", `want a shard number`},
		{"drain now", "drain takes 0 argument(s)"},
	} {
		err := c.Exec(tc.line)
		if !errors.Is(err, ErrUsage) || !errors.Is(err, fs.ErrInvalid) || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("Exec(%q) = %v; want a refusal saying %q", tc.line, err, tc.reason)
		}
	}
	if err := c.Exec("close 3 4009"); err != nil {
		t.Fatal(err)
	}
	ev := readAll(c)
	if !strings.Contains(ev, `event=rejected cmd="close 0 99" err="close code \"99\": want 1000 to 4999;`) {
		t.Errorf("events lack the refusal's reason:\n%s", ev)
	}
	if !strings.Contains(ev, `event=applied cmd="close 3 4009" fault="close 4009" connections=0`) {
		t.Errorf("events lack the applied command:\n%s", ev)
	}
}

// outgrow N makes discovery recommend N and gives the bot guilds enough
// that a smaller plan's shards hold more than 2,500 each.
func TestOutgrow(t *testing.T) {
	sim, c := newControl(t, gatewaysim.Config{Shards: 2})
	if err := c.Exec("outgrow 3"); err != nil {
		t.Fatal(err)
	}
	if got := len(sim.Guilds(0, 2)); got <= gatewaysim.MaxGuildsPerShard {
		t.Errorf("after outgrow 3, shard 0 of 2 holds %d guilds; want over %d", got, gatewaysim.MaxGuildsPerShard)
	}
	if got := len(sim.Guilds(0, 3)); got > gatewaysim.MaxGuildsPerShard {
		t.Errorf("after outgrow 3, shard 0 of 3 holds %d guilds; want at most %d", got, gatewaysim.MaxGuildsPerShard)
	}
	if st := string(c.Status()); !strings.Contains(st, "shards 3\nguilds 7470\n") {
		t.Errorf("status after outgrow 3:\n%s", st)
	}
}

func readAll(c *Control) string {
	l := c.Events()
	buf := make([]byte, l.Size())
	n, _ := l.ReadAt(buf, 0)
	return string(buf[:n])
}
