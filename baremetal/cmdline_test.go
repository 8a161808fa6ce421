package baremetal

import (
	"errors"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/shardfs/shardfs/core"
	"github.com/shardfs/shardfs/fsrv"
)

const good = "BOOT_IMAGE=vmlinuz console=ttyS0 quiet shardfs.flavor=discord shardfs.total=16 shardfs.shards=0-7 shardfs.listen=tls!0.0.0.0!5641 shardfs.api=https://discord.com/api/v10"

func TestParseCmdline(t *testing.T) {
	s, probs := ParseCmdline(good)
	if len(probs) != 0 {
		t.Fatalf("ParseCmdline(good) problems = %v; want none", probs)
	}
	want := Settings{Flavor: core.Discord, Total: "16", Shards: "0-7", Listen: []string{"tls!0.0.0.0!5641"}, API: "https://discord.com/api/v10"}
	if s.Flavor != want.Flavor || s.Total != want.Total || s.Shards != want.Shards || !slices.Equal(s.Listen, want.Listen) || s.API != want.API {
		t.Errorf("ParseCmdline(good) = %+v; want %+v", s, want)
	}
	args := strings.Join(s.Args(), " ")
	if wantArgs := "--flavor discord --total 16 --shards 0-7 --listen tls!0.0.0.0!5641 --api https://discord.com/api/v10"; args != wantArgs {
		t.Errorf("Args() = %q; want %q", args, wantArgs)
	}
}

func TestParseCmdlineProblems(t *testing.T) {
	base := "shardfs.flavor=fluxer shardfs.total=4 shardfs.listen=tcp!0.0.0.0!5640,insecure "
	for _, tc := range []struct {
		name, line string
		key        string // the key the problem names
		fatal      bool
		err        error
	}{
		{"unknown key", base + "shardfs.totl=5", "shardfs.totl", false, ErrUnknownKey},
		{"bot without etcd", base + "shardfs.bot=mybot", "shardfs.bot", false, nil},
		{"bad flavor", "shardfs.flavor=slack shardfs.total=4 shardfs.listen=unix!/run/s", "shardfs.flavor", true, ErrMalformed},
		{"zero total", "shardfs.flavor=discord shardfs.total=0 shardfs.listen=unix!/run/s", "shardfs.total", true, ErrMalformed},
		{"bad shards", base + "shardfs.shards=3-1", "shardfs.shards", true, ErrMalformed},
		{"shards beyond total", base + "shardfs.shards=0-9", "shardfs.shards", true, ErrMalformed},
		{"bad listen option", "shardfs.flavor=discord shardfs.total=4 shardfs.listen=tcp!0.0.0.0!1,rw", "shardfs.listen", true, ErrMalformed},
		{"no value", base + "shardfs.api", "shardfs.api", true, ErrMalformed},
		{"api not a URL", base + "shardfs.api=discord.com", "shardfs.api", true, ErrMalformed},
		{"gateway over http", base + "shardfs.gateway=https://gw", "shardfs.gateway", true, ErrMalformed},
		{"conflicting duplicate", base + "shardfs.total=5", "shardfs.total", true, ErrMalformed},
		{"missing flavor", "shardfs.total=4 shardfs.listen=unix!/run/s", "shardfs.flavor", true, ErrMissing},
		{"missing total", "shardfs.flavor=discord shardfs.listen=unix!/run/s", "shardfs.total", true, ErrMissing},
		{"token", base + "shardfs.token=abc.def", "shardfs.token", true, ErrSecret},
		{"code", base + "shardfs.code=ABCD-EFGH-IJKL-MNOP", "shardfs.code", true, ErrCode},
		{"token in the environment", base + "SHARDFS_TOKEN=abc.def", "SHARDFS_TOKEN", true, ErrSecret},
		{"etcd without bot", base + "shardfs.etcd=http://10.0.0.1:2379", "shardfs.bot", true, ErrMissing},
		{"node without etcd", base + "shardfs.node=n1", "shardfs.node", false, nil},
		{"bad node", base + "shardfs.etcd=http://e:2379 shardfs.bot=b shardfs.node=a/b", "shardfs.node", true, ErrMalformed},
		{"plain tcp beyond loopback", "shardfs.flavor=discord shardfs.total=4 shardfs.listen=tcp!0.0.0.0!5641", "shardfs.listen", true, fsrv.ErrInsecure},
		{"plain tcp on a host name", "shardfs.flavor=discord shardfs.total=4 shardfs.listen=tcp!node1!5641", "shardfs.listen", true, fsrv.ErrInsecure},
		{"plain tcp on any address", "shardfs.flavor=discord shardfs.total=4 shardfs.listen=tcp!!5641,ro", "shardfs.listen", true, fsrv.ErrInsecure},
		{"bad etcd", base + "shardfs.etcd=10.0.0.1:2379", "shardfs.etcd", true, ErrMalformed},
		{"bad bot", base + "shardfs.etcd=http://e:2379 shardfs.bot=a/b", "shardfs.bot", true, ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, probs := ParseCmdline(tc.line)
			i := slices.IndexFunc(probs, func(p Problem) bool { return p.Key == tc.key })
			if i < 0 {
				t.Fatalf("ParseCmdline(%q) = %v; want a problem naming %s", tc.line, probs, tc.key)
			}
			p := probs[i]
			if p.Fatal != tc.fatal {
				t.Errorf("%s: Fatal = %v; want %v", p, p.Fatal, tc.fatal)
			}
			if tc.err != nil && !errors.Is(p.Err, tc.err) {
				t.Errorf("%s: Err = %v; want %v", p, p.Err, tc.err)
			}
			if !strings.HasPrefix(p.String(), tc.key+": ") {
				t.Errorf("String() = %q; want it to start with the key", p)
			}
			if strings.Contains(p.String(), "abc.def") {
				t.Errorf("String() = %q shows the token", p)
			}
		})
	}
}

// TestCmdlineToServe: the command line of a fleet node becomes serve's
// etcd flags, with the files enrollment brought;
// plain TCP on loopback or with ,insecure is allowed.
func TestCmdlineToServe(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		files      func(*Settings)
		want       string
	}{
		{"fleet node", "shardfs.flavor=discord shardfs.total=auto shardfs.etcd=https://10.0.0.1:2379,https://10.0.0.2:2379 shardfs.bot=mybot shardfs.node=rack1-3",
			func(s *Settings) {
				s.TLSCert, s.TLSKey, s.TLSClientCA = TLSCertPath, TLSKeyPath, TLSClientCAPath
				s.Listen = []string{DefaultListen}
				s.EtcdCA, s.EtcdCert, s.EtcdKey = EtcdCAPath, EtcdCertPath, EtcdKeyPath
			},
			"--flavor discord --total auto --listen tls!0.0.0.0!5641 --tls-cert /secrets/tls.crt --tls-key /secrets/tls.key --tls-client-ca /secrets/client-ca.crt --etcd https://10.0.0.1:2379,https://10.0.0.2:2379 --bot mybot --node rack1-3 --etcd-ca /secrets/etcd-ca.crt --etcd-cert /secrets/etcd.crt --etcd-key /secrets/etcd.key"},
		{"fleet node, plain etcd, no name", "shardfs.flavor=fluxer shardfs.total=8 shardfs.listen=tcp!127.0.0.1!5640 shardfs.etcd=http://e:2379 shardfs.bot=b", nil,
			"--flavor fluxer --total 8 --listen tcp!127.0.0.1!5640 --etcd http://e:2379 --bot b"},
		{"plain tcp, insecure", "shardfs.flavor=discord shardfs.total=1 shardfs.listen=tcp!0.0.0.0!5641,insecure shardfs.listen=tcp!localhost!5640,ro", nil,
			"--flavor discord --total 1 --listen tcp!0.0.0.0!5641,insecure --listen tcp!localhost!5640,ro"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, probs := ParseCmdline(tc.line)
			if len(probs) != 0 {
				t.Fatalf("ParseCmdline(%q) problems = %v; want none", tc.line, probs)
			}
			if tc.files != nil {
				tc.files(&s)
			}
			if got := strings.Join(s.Args(), " "); got != tc.want {
				t.Errorf("Args() =\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestNodeName(t *testing.T) {
	mac := net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56}
	for _, tc := range []struct {
		host string
		mac  net.HardwareAddr
		want string
	}{
		{"rack1-3", mac, "rack1-3"},
		{"", mac, "pxe-52-54-00-12-34-56"},
		{"a/b", mac, "pxe-52-54-00-12-34-56"},
		{"", nil, "pxe-node"},
	} {
		if got := NodeName(tc.host, tc.mac); got != tc.want {
			t.Errorf("NodeName(%q, %v) = %q; want %q", tc.host, tc.mac, got, tc.want)
		}
	}
}

func TestParseCmdlineDefaults(t *testing.T) {
	// Unknown keys and other programs' words leave the settings alone;
	// listen repeats; identical duplicates are fine; quotes group words.
	s, probs := ParseCmdline(`root=/dev/ram0 shardfs.flavor=discord shardfs.flavor=discord shardfs.total=auto shardfs.color=blue shardfs.listen="unix!/run/a b" shardfs.listen=tcp!127.0.0.1!5640,ro`)
	if len(probs) != 1 || probs[0].Key != "shardfs.color" || probs[0].Fatal {
		t.Errorf("problems = %v; want one, not fatal, naming shardfs.color", probs)
	}
	if want := []string{"unix!/run/a b", "tcp!127.0.0.1!5640,ro"}; !slices.Equal(s.Listen, want) {
		t.Errorf("Listen = %q; want %q", s.Listen, want)
	}
	if s.Total != "auto" || s.Flavor != core.Discord {
		t.Errorf("Settings = %+v", s)
	}
}

func TestSplitCmdline(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"  a  b\n", []string{"a", "b"}},
		{`a="x y" b`, []string{"a=x y", "b"}},
		{`"q"`, []string{"q"}},
		{`a=""`, []string{"a="}},
	} {
		if got := splitCmdline(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("splitCmdline(%q) = %q; want %q", tc.in, got, tc.want)
		}
	}
}

// FuzzParseCmdline: any line parses without panicking; every problem
// names a shardfs.* key; a line without fatal problems gives settings
// whose flags name a valid flavor, total and listener; the token never
// shows in a problem.
func FuzzParseCmdline(f *testing.F) {
	f.Add(good)
	f.Add(`shardfs.token=SECRET shardfs.total="1 2" shardfs.shards=0-`)
	f.Add("shardfs.listen=unix!/x,ro shardfs.flavor=fluxer shardfs.total=auto shardfs.etcd=http://a:1,https://b:2")
	f.Fuzz(func(t *testing.T, line string) {
		s, probs := ParseCmdline(line)
		fatal := false
		for _, p := range probs {
			if !strings.HasPrefix(p.Key, "shardfs.") && p.Key != "SHARDFS_TOKEN" {
				t.Fatalf("problem %v names no shardfs key", p)
			}
			if p.Key == "shardfs.token" && strings.Contains(line, "shardfs.token=SECRET") && strings.Contains(p.String(), "SECRET") {
				t.Fatalf("problem %v shows the token", p)
			}
			fatal = fatal || p.Fatal
		}
		if fatal {
			return
		}
		if s.Total == "" {
			t.Fatalf("no fatal problem but settings %+v lack the total", s)
		}
		if _, err := core.ParseFlavor(s.Flavor.String()); err != nil {
			t.Fatal(err)
		}
	})
}
