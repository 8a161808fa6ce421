package doc_test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/shardfs/shardfs/certs"
	"github.com/shardfs/shardfs/enroll"
	"github.com/shardfs/shardfs/fsrv"
)

// TestReferenceEnroll: the reference names every file of the enrollment
// server's tree (shardfs netboot --serve), marked (enrollment server),
// with its mode, and its ctl's commands.
func TestReferenceEnroll(t *testing.T) {
	ref := parseReference(t, "shardfs.4.md")
	ca, err := certs.NewCA("ca", certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := ca.Issue(certs.Server, "enroll", nil, certs.Validity{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := enroll.New(enroll.Config{Cert: sc.TLS(), NodeCA: ca})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	var usage string
	var visit func(dir string, d *fsrv.Dir)
	visit = func(dir string, d *fsrv.Dir) {
		for _, f := range d.List() {
			p := dir + "/" + fsrv.FileName(f)
			got[p], _ = mode(f)
			switch f := f.(type) {
			case *fsrv.Dir:
				visit(p, f)
			case *fsrv.Ctl:
				usage = f.Usage()
			}
		}
	}
	visit("", fsrv.NewDir("", srv.Dir()))
	want := ref.files["enrollment server"]
	if !maps.Equal(got, want) {
		t.Errorf("the enrollment server's tree = %v; shardfs.4.md lists %v", got, want)
	}
	entry := ref.entry["/enroll/ctl"]
	for line := range strings.Lines(usage) {
		if cmd := strings.TrimSpace(line); !strings.Contains(entry, "`"+cmd+"`") {
			t.Errorf("/enroll/ctl accepts %q, which its entry in shardfs.4.md does not name", cmd)
		}
	}
	if len(slices.Collect(maps.Keys(want))) == 0 {
		t.Error("shardfs.4.md lists no file of the enrollment server")
	}
}
