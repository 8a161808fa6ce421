package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// certs writes DIR/NAME.crt and DIR/NAME.key: a --name that is not a
// plain file name is refused, and nothing is written beside or outside
// DIR.
func TestCertsNameStaysInDir(t *testing.T) {
	top := t.TempDir()
	dir := filepath.Join(top, "pki")
	var out, errb strings.Builder
	if err := run(context.Background(), []string{"certs", "ca", "--dir", dir}, strings.NewReader(""), &out, &errb); err != nil {
		t.Fatalf("certs ca: %v\n%s", err, errb.String())
	}
	for _, name := range []string{"..", ".", "../x", "a/b", `a\b`, ".hidden", ""} {
		for _, kind := range []string{"client", "server"} {
			err := run(context.Background(), []string{"certs", kind, "--dir", dir, "--name", name}, strings.NewReader(""), &out, &errb)
			if err == nil || !strings.Contains(err.Error(), "--name") {
				t.Errorf("certs %s --name %q = %v; want a refusal naming --name", kind, name, err)
			}
		}
	}
	for _, d := range []string{top, dir} {
		ents, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if n := e.Name(); n != "pki" && n != "ca.crt" && n != "ca.key" {
				t.Errorf("certs wrote %s in %s", n, d)
			}
		}
	}
	if err := run(context.Background(), []string{"certs", "client", "--dir", dir, "--name", "grafana"}, strings.NewReader(""), &out, &errb); err != nil {
		t.Errorf("certs client --name grafana = %v", err)
	}
}
