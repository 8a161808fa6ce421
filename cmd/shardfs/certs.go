package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/shardfs/shardfs/certs"
)

// runCerts makes the certificates of a tls! listener (package certs says
// why shardfs has this helper rather than openssl recipes):
//
//	shardfs certs ca     --dir DIR [--name NAME]
//	shardfs certs server --dir DIR --name NAME [--host NAME|IP,...] [--days N]
//	shardfs certs client --dir DIR --name NAME [--days N]
//
// The CA is DIR/ca.crt and DIR/ca.key; a certificate is DIR/NAME.crt and
// DIR/NAME.key. Keys are written 0600 and never over an existing file.
func runCerts(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("certs needs ca, server or client")
	}
	kind, args := args[0], args[1:]
	fl := flag.NewFlagSet("certs "+kind, flag.ContinueOnError)
	fl.SetOutput(stderr)
	dir := fl.String("dir", ".", "folder of the CA and the certificates")
	name := fl.String("name", "", "common name: the CA's (default shardfs CA), the server's or the client's (required); also the file name")
	hosts := fl.String("host", "", "server: the DNS names and IP addresses clients dial, comma-separated (default: --name)")
	days := fl.Int("days", 0, "validity in days (default: CA 3650, server 365, client 90)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() > 0 {
		return flagErr(fl, "unexpected argument %q", fl.Arg(0))
	}
	if *days < 0 {
		return flagErr(fl, "--days %d: want a positive count", *days)
	}
	var v certs.Validity
	if *days > 0 {
		v.NotAfter = time.Now().Add(time.Duration(*days) * 24 * time.Hour)
	}
	caBase := filepath.Join(*dir, "ca")
	if kind == "ca" {
		n := *name
		if n == "" {
			n = "shardfs CA"
		}
		ca, err := certs.NewCA(n, v)
		if err != nil {
			return err
		}
		if err := certs.WriteFiles(caBase, ca.Cert, ca.Key); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "CA %q: %s.crt (give it to servers as --tls-client-ca and to clients as --ca), %s.key (keep it off the nodes)\n", n, caBase, caBase)
		return nil
	}
	var k certs.Kind
	switch kind {
	case "server":
		k = certs.Server
	case "client":
		k = certs.Client
	default:
		return fmt.Errorf("certs %s: want ca, server or client", kind)
	}
	if err := certFileName(*name); err != nil {
		return flagErr(fl, "--name %q: %v", *name, err)
	}
	if k == certs.Client && *hosts != "" {
		return flagErr(fl, "--host is for server certificates")
	}
	ca, err := certs.LoadCA(caBase)
	if err != nil {
		return fmt.Errorf("%w (make one with: shardfs certs ca --dir %s)", err, *dir)
	}
	var names []string
	if *hosts != "" {
		names = strings.Split(*hosts, ",")
	}
	c, err := ca.Issue(k, *name, names, v)
	if err != nil {
		return err
	}
	base := filepath.Join(*dir, *name)
	if err := certs.WriteFiles(base, c.Cert, c.Key); err != nil {
		return err
	}
	switch k {
	case certs.Server:
		fmt.Fprintf(stdout, "server %q for %s until %s: serve --tls-cert %s.crt --tls-key %s.key --tls-client-ca %s.crt\n", *name, strings.Join(append(c.Cert.DNSNames, ipStrings(c.Cert.IPAddresses)...), ", "), c.Cert.NotAfter.UTC().Format(time.DateOnly), base, base, caBase)
	default:
		fmt.Fprintf(stdout, "client %q until %s: --cert %s.crt --key %s.key --ca %s.crt\n", *name, c.Cert.NotAfter.UTC().Format(time.DateOnly), base, base, caBase)
	}
	return nil
}

// certFileName refuses a --name that is not a plain file name: the
// files are DIR/NAME.crt and DIR/NAME.key, and "..", "." or a name with a
// separator would put them beside or outside DIR.
func certFileName(name string) error {
	switch {
	case name == "":
		return errors.New("a name is required")
	case name == "." || name == ".." || strings.ContainsAny(name, "/\\\x00"):
		return errors.New("want a plain file name: no slashes, not . or ..")
	case strings.HasPrefix(name, "."):
		return errors.New("want a name that does not start with a dot (the files would be hidden)")
	}
	return nil
}

func ipStrings(ips []net.IP) []string {
	var s []string
	for _, ip := range ips {
		s = append(s, ip.String())
	}
	return s
}
