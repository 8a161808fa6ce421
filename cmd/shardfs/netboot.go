package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/shardfs/shardfs/baremetal"
	"github.com/shardfs/shardfs/fsrv"
)

// runNetboot writes a PXE boot image for a bare-metal node (DESIGN 7.6).
func runNetboot(args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("netboot", flag.ContinueOnError)
	fl.SetOutput(stderr)
	out := fl.String("out", "", "folder to write boot.ipxe, initrd.cpio.gz (and vmlinuz, tls.cpio.gz, secrets.cpio.gz) into (required)")
	initBin := fl.String("init", "", "the static shardfs binary to make /init (default: this binary)")
	kernelDir := fl.String("kernel", "", "Debian's linux-image package unpacked with dpkg -x: its vmlinuz is copied and its NIC modules go into the image")
	modules := fl.String("modules", strings.Join(baremetal.DefaultNICModules, ","), "NIC modules to carry, with their dependencies (with --kernel)")
	cmdline := fl.String("cmdline", "", "kernel command line: the shardfs.* keys ("+strings.Join(baremetal.Keys, ", ")+"); console=, quiet, edd= or panic= replace the defaults '"+baremetal.DefaultConsole+" "+strings.Join(baremetal.DefaultOptions, " ")+"'")
	tokenFile := fl.String("token-file", "", "file holding the bot token, written into secrets.cpio.gz (mode 0600), never into the image")
	etcdCA := fl.String("etcd-ca", "", "with shardfs.etcd: CA certificate of etcd's TLS, written into secrets.cpio.gz")
	etcdCert := fl.String("etcd-cert", "", "with shardfs.etcd: client certificate for etcd, written into secrets.cpio.gz")
	etcdKey := fl.String("etcd-key", "", "with shardfs.etcd: the client certificate's key, written into secrets.cpio.gz (mode 0600)")
	var tf tlsFlags
	tf.register(fl)
	caBundle := fl.String("ca-bundle", baremetal.CABundlePath, "PEM file of the certificate authorities the node trusts for wss:// and https:// (empty: none)")
	dryRun := fl.Bool("dry-run", false, "print what would be written and write nothing")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() > 0 {
		return flagErr(fl, "unexpected argument %q", fl.Arg(0))
	}
	if *out == "" && !*dryRun {
		return flagErr(fl, "--out is required")
	}
	if *kernelDir == "" && *modules != strings.Join(baremetal.DefaultNICModules, ",") {
		return flagErr(fl, "--modules needs --kernel DIR to take them from")
	}
	settings, probs := baremetal.ParseCmdline(*cmdline)
	var refused []string
	for _, p := range probs {
		if p.Fatal {
			refused = append(refused, p.String())
		} else {
			fmt.Fprintf(stderr, "netboot: warning: --cmdline %s\n", p)
		}
	}
	if len(settings.Etcd) == 0 && (*etcdCA != "" || *etcdCert != "" || *etcdKey != "") {
		refused = append(refused, "--etcd-ca, --etcd-cert, --etcd-key: need shardfs.etcd on the command line")
	}
	if (*etcdCert == "") != (*etcdKey == "") {
		refused = append(refused, "--etcd-cert and --etcd-key go together")
	}
	if len(settings.Listen) == 0 && tf.key == "" {
		refused = append(refused, "shardfs.listen: missing, and no --tls-cert --tls-key --tls-client-ca for the default "+baremetal.DefaultListen)
	}
	for _, l := range settings.Listen {
		if strings.HasPrefix(l, "tls!") && tf.key == "" {
			refused = append(refused, "shardfs.listen="+l+": needs --tls-cert --tls-key --tls-client-ca")
		}
	}
	if len(refused) > 0 {
		return fmt.Errorf("--cmdline: the node would refuse to start:\n  %s", strings.Join(refused, "\n  "))
	}
	nb := baremetal.Netboot{Cmdline: *cmdline, TokenFile: *tokenFile, CABundle: *caBundle,
		TLSCert: tf.cert, TLSKey: tf.key, TLSClientCA: tf.clientCA,
		EtcdCA: *etcdCA, EtcdCert: *etcdCert, EtcdKey: *etcdKey}
	if tf.cert != "" || tf.key != "" || tf.clientCA != "" {
		// The same check serve makes, now rather than on the node.
		if _, err := fsrv.ServerTLSConfig(tf.cert, tf.key, tf.clientCA); err != nil {
			return fmt.Errorf("--tls-cert, --tls-key, --tls-client-ca: %w", err)
		}
		if err := checkSecretFile("--tls-key", tf.key); err != nil {
			return err
		}
	}
	if *caBundle != "" {
		if _, err := os.Stat(*caBundle); err != nil {
			return fmt.Errorf("--ca-bundle: %w (Debian package ca-certificates; or --ca-bundle '' for a node that reaches no TLS server)", err)
		}
	}
	if *tokenFile != "" {
		if err := checkSecretFile("--token-file", *tokenFile); err != nil {
			return err
		}
	}
	if *etcdCert != "" {
		// The same check serve's --etcd-cert makes, now rather than on
		// the node.
		if _, err := tls.LoadX509KeyPair(*etcdCert, *etcdKey); err != nil {
			return fmt.Errorf("--etcd-cert, --etcd-key: %w", err)
		}
		if err := checkSecretFile("--etcd-key", *etcdKey); err != nil {
			return err
		}
	}
	if *etcdCA != "" {
		if b, err := os.ReadFile(*etcdCA); err != nil {
			return fmt.Errorf("--etcd-ca: %w", err)
		} else if !x509.NewCertPool().AppendCertsFromPEM(b) {
			return fmt.Errorf("--etcd-ca %s: no PEM certificate in it", *etcdCA)
		}
	}
	self := *initBin
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return fmt.Errorf("finding this binary for /init: %w", err)
		}
	}
	if err := baremetal.CheckStatic(self); err != nil {
		return err
	}
	nb.Init = self
	if *kernelDir != "" {
		k, err := baremetal.FindKernel(*kernelDir)
		if err != nil {
			return err
		}
		names := slices.DeleteFunc(strings.Split(*modules, ","), func(s string) bool { return strings.TrimSpace(s) == "" })
		if nb.Modules, err = k.ResolveModules(names); err != nil {
			return fmt.Errorf("--modules: %w", err)
		}
		nb.Kernel = &k
	}
	if *dryRun {
		fmt.Fprint(stdout, nb.String())
		return nil
	}
	sizes, err := nb.Write(*out)
	if err != nil {
		return fmt.Errorf("netboot: %w", err)
	}
	for _, o := range nb.Outputs() {
		fmt.Fprintf(stdout, "%-16s %04o %9d bytes  %s\n", o.Name, o.Mode, sizes[o.Name], o.What)
	}
	return nil
}

// checkSecretFile refuses a secret (the token, the TLS key) that is
// missing, empty, or that other users can read: it should not be exposed
// on the build machine either.
func checkSecretFile(flagName, name string) error {
	fi, err := os.Stat(name)
	if err != nil {
		return fmt.Errorf("%s: %w", flagName, err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("%s %s: mode %04o lets other users read it; chmod 600 it", flagName, name, fi.Mode().Perm())
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return fmt.Errorf("%s: %w", flagName, err)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return errors.New(flagName + " " + name + ": empty")
	}
	return nil
}
