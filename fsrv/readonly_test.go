package fsrv

import (
	"errors"
	"io"
	"io/fs"
	"net"
	"slices"
	"strings"
	"testing"

	"9fans.net/go/plan9"
	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
)

func TestParseListenAddr(t *testing.T) {
	tests := []struct {
		in   string
		want ListenAddr
	}{
		{"tcp!127.0.0.1!5640", ListenAddr{Network: "tcp", Address: "127.0.0.1:5640"}},
		{"tcp!127.0.0.1!5640,ro", ListenAddr{Network: "tcp", Address: "127.0.0.1:5640", ReadOnly: true}},
		{"tcp!*!564,insecure,ro", ListenAddr{Network: "tcp", Address: ":564", ReadOnly: true, Insecure: true}},
		{"/run/shardfs.sock,ro", ListenAddr{Network: "unix", Address: "/run/shardfs.sock", ReadOnly: true}},
		{",ro", ListenAddr{Network: "tcp", Address: "127.0.0.1:5640", ReadOnly: true}},
	}
	for _, tt := range tests {
		got, err := ParseListenAddr(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseListenAddr(%q) = %+v, %v; want %+v, nil", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"tcp!127.0.0.1!5640,rw", "tcp!127.0.0.1!5640,", "tcp!127.0.0.1!5640,ro,,insecure", "tcp!host!,ro"} {
		_, err := ParseListenAddr(bad)
		if !errors.Is(err, fs.ErrInvalid) {
			t.Errorf("ParseListenAddr(%q) = %v; want an fs.ErrInvalid error", bad, err)
		}
	}
	if _, err := ParseListenAddr("tcp!127.0.0.1!1,rw"); err == nil || !strings.Contains(err.Error(), `unknown listener option "rw"`) {
		t.Errorf("ParseListenAddr(,rw) = %v; want it to name the unknown option", err)
	}
	if _, _, err := ParseAddr("tcp!127.0.0.1!1,bogus"); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("ParseAddr(,bogus) = %v; want an fs.ErrInvalid error", err)
	}
}

// TestListenInsecure: plain TCP beyond loopback needs ,insecure, and the
// refusal names the TLS listener to use instead.
func TestListenInsecure(t *testing.T) {
	for _, addr := range []string{"tcp!*!0", "tcp!0.0.0.0!0", ":0", "tcp![::]!0", "tcp!192.0.2.1!0"} {
		l, err := Listen(addr)
		if err == nil {
			l.Close()
			t.Errorf("Listen(%q) = nil; want ErrInsecure", addr)
			continue
		}
		if !errors.Is(err, ErrInsecure) || !strings.Contains(err.Error(), "use tls!") || !strings.Contains(err.Error(), ",insecure") {
			t.Errorf("Listen(%q) = %v; want ErrInsecure naming tls!HOST!PORT and ,insecure", addr, err)
		}
	}
	for _, addr := range []string{"tcp!127.0.0.1!0", "tcp![::1]!0", "localhost:0", "tcp!0.0.0.0!0,insecure"} {
		l, err := Listen(addr)
		if err != nil {
			if strings.Contains(addr, "::1") && !errors.Is(err, ErrInsecure) {
				continue // a machine without IPv6 loopback
			}
			t.Errorf("Listen(%q) = %v; want nil", addr, err)
			continue
		}
		l.Close()
	}
}

// serveRO serves fx read-only on loopback TCP through Listen(",ro").
func serveRO(t *testing.T, fx *fixture) string {
	t.Helper()
	l, err := Listen("tcp!127.0.0.1!0,ro")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, fx.server(t), l)
}

func listDotL(t *testing.T, root p9.File) []string {
	t.Helper()
	_, d, err := root.Walk(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, _, err := d.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
	var names []string
	for off := uint64(0); ; {
		ents, err := d.Readdir(off, 4096)
		if err != nil && err != io.EOF {
			t.Fatal(err)
		}
		if len(ents) == 0 {
			return names
		}
		for _, e := range ents {
			names = append(names, e.Name)
		}
		off = ents[len(ents)-1].Offset
	}
}

// TestReadOnlyDotL: on a ,ro listener every write is EACCES and private
// files are absent; the same tree stays writable on another listener.
func TestReadOnlyDotL(t *testing.T) {
	fx := newFixture()
	_, root := dialDotL(t, serveRO(t, fx))

	if got, want := listDotL(t, root), []string{"ctl", "status", "events", "1"}; !slices.Equal(got, want) {
		t.Errorf("ro listing = %q; want %q (send is private)", got, want)
	}
	if _, _, err := root.Walk([]string{"send"}); !errors.Is(err, linux.ENOENT) {
		t.Errorf("ro Walk(send) = %v; want ENOENT", err)
	}
	if _, _, _, _, err := root.WalkGetAttr([]string{"send"}); !errors.Is(err, linux.ENOENT) {
		t.Errorf("ro WalkGetAttr(send) = %v; want ENOENT", err)
	}
	if got := readDotL(t, root, "ctl"); got != "stop\nstart\nlease DURATION\n" {
		t.Errorf("ro read ctl = %q", got)
	}
	if got := readDotL(t, root, "status"); got != "READY\n" {
		t.Errorf("ro read status = %q", got)
	}

	_, ctl, err := root.Walk([]string{"ctl"})
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	if _, _, a, err := ctl.GetAttr(p9.AttrMaskAll); err != nil || a.Mode != p9.ModeRegular|0444 {
		t.Errorf("ro GetAttr(ctl) = %v, %v; want mode -r--r--r--", a.Mode, err)
	}
	for _, flags := range []p9.OpenFlags{p9.WriteOnly, p9.ReadWrite, p9.ReadOnly | dotlOTrunc} {
		_, f, _ := ctl.Walk(nil)
		if _, _, err := f.Open(flags); !errors.Is(err, linux.EACCES) {
			t.Errorf("ro Open(ctl, %#x) = %v; want EACCES", flags, err)
		}
		f.Close()
	}
	// What Linux sends after open for `echo x > ctl`, should the open
	// have passed.
	if err := ctl.SetAttr(p9.SetAttrMask{Size: true, MTime: true, CTime: true}, p9.SetAttr{}); !errors.Is(err, linux.EACCES) {
		t.Errorf("ro SetAttr(ctl, size 0) = %v; want EACCES", err)
	}
	if err := ctl.SetAttr(p9.SetAttrMask{MTime: true}, p9.SetAttr{}); !errors.Is(err, linux.EACCES) {
		t.Errorf("ro SetAttr(ctl, mtime) = %v; want EACCES", err)
	}
	_, d, _ := root.Walk(nil)
	if _, _, _, err := d.Create("new", p9.WriteOnly, 0644, p9.NoUID, p9.NoGID); !errors.Is(err, linux.EACCES) {
		t.Errorf("ro Create = %v; want EACCES", err)
	}
	d.Close()
	if err := root.UnlinkAt("ctl", 0); !errors.Is(err, linux.EACCES) {
		t.Errorf("ro UnlinkAt(ctl) = %v; want EACCES", err)
	}
	if h := fx.takeHandled(); len(h) != 0 {
		t.Errorf("ro connection handled %q; want nothing", h)
	}
	// Attaching at a private name is attaching at nothing.
	c, err := net.Dial("tcp", serveRO(t, fx))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := p9.NewClient(c)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Attach("send"); !errors.Is(err, linux.ENOENT) {
		t.Errorf("ro Attach(send) = %v; want ENOENT", err)
	}

	// The same tree on a read-write listener.
	_, rw := dialDotL(t, listen(t, fx.server(t)))
	if got := listDotL(t, rw); !slices.Contains(got, "send") {
		t.Errorf("rw listing = %q; want send in it", got)
	}
	if err := writeDotL(rw, "send", "{}\n"); err != nil {
		t.Errorf("rw write send = %v; want nil", err)
	}
}

// TestReadOnlyPlan9 is TestReadOnlyDotL under 9P2000: the refusals are
// "permission denied: ..." strings.
func TestReadOnlyPlan9(t *testing.T) {
	fx := newFixture()
	fsys := dial9(t, serveRO(t, fx))

	fid, err := fsys.Open("/", plan9.OREAD)
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := fid.Dirreadall()
	fid.Close()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range dirs {
		names = append(names, d.Name)
	}
	if want := []string{"ctl", "status", "events", "1"}; !slices.Equal(names, want) {
		t.Errorf("ro listing = %q; want %q (send is private)", names, want)
	}
	if _, err := fsys.Stat("send"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("ro Stat(send) = %v; want file not found", err)
	}
	d, err := fsys.Stat("ctl")
	if err != nil || d.Mode != 0444 {
		t.Errorf("ro Stat(ctl) = %v, %v; want mode 0444", d, err)
	}
	denied := func(what string, err error) {
		t.Helper()
		if err == nil || !strings.HasPrefix(err.Error(), "permission denied") {
			t.Errorf("ro %s = %v; want permission denied: ...", what, err)
		}
	}
	for _, mode := range []uint8{plan9.OWRITE, plan9.ORDWR, plan9.OREAD | plan9.OTRUNC} {
		f, err := fsys.Open("ctl", mode)
		if err == nil {
			f.Close()
		}
		denied("Open(ctl)", err)
	}
	trunc := plan9.Dir{}
	trunc.Null()
	trunc.Length = 0
	denied("Wstat(ctl, length 0)", fsys.Wstat("ctl", &trunc))
	touch := plan9.Dir{}
	touch.Null()
	touch.Mtime = 1
	denied("Wstat(ctl, mtime)", fsys.Wstat("ctl", &touch))
	_, err = fsys.Create("new", plan9.OWRITE, 0644)
	denied("Create", err)
	denied("Remove(ctl)", fsys.Remove("ctl"))
	if f, err := fsys.Open("ctl", plan9.OREAD); err != nil {
		t.Errorf("ro Open(ctl, OREAD) = %v; want nil", err)
	} else {
		f.Close()
	}
	if h := fx.takeHandled(); len(h) != 0 {
		t.Errorf("ro connection handled %q; want nothing", h)
	}

	rw := dial9(t, listen(t, fx.server(t)))
	if _, err := rw.Stat("send"); err != nil {
		t.Errorf("rw Stat(send) = %v; want nil", err)
	}
}
