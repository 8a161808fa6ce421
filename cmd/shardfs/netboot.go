package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/shardfs/shardfs/baremetal"
)

// runNetboot writes a PXE boot image for a bare-metal node, or with
// --serve runs the enrollment server that gives the nodes their secrets
// (DESIGN 7.6).
func runNetboot(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("netboot", flag.ContinueOnError)
	fl.SetOutput(stderr)
	out := fl.String("out", "", "folder to write boot.ipxe and initrd.cpio.gz (and vmlinuz) into (required)")
	initBin := fl.String("init", "", "the static shardfs binary to make /init (default: this binary)")
	kernelDir := fl.String("kernel", "", "Debian's linux-image package unpacked with dpkg -x: its vmlinuz is copied and its NIC modules go into the image")
	modules := fl.String("modules", strings.Join(baremetal.DefaultNICModules, ","), "NIC modules to carry, with their dependencies (with --kernel)")
	cmdline := fl.String("cmdline", "", "kernel command line: the shardfs.* keys ("+strings.Join(baremetal.Keys, ", ")+"); console=, quiet, edd= or panic= replace the defaults '"+baremetal.DefaultConsole+" "+strings.Join(baremetal.DefaultOptions, " ")+"'")
	enrollCA := fl.String("enroll-ca", "", "with shardfs.enroll: the enrollment CA's certificate, the only one the node trusts for the enrollment server (put into the image: it is no secret)")
	caBundle := fl.String("ca-bundle", baremetal.CABundlePath, "PEM file of the certificate authorities the node trusts for wss:// and https:// (empty: none)")
	dryRun := fl.Bool("dry-run", false, "print what would be written and write nothing")
	var ef enrollFlags
	ef.register(fl)
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() > 0 {
		return flagErr(fl, "unexpected argument %q", fl.Arg(0))
	}
	if *ef.serve != "" {
		for _, name := range []string{"out", "init", "kernel", "modules", "cmdline", "enroll-ca", "ca-bundle", "dry-run"} {
			if flagSet(fl, name) {
				return flagErr(fl, "--%s makes an image; --serve runs the enrollment server: run them apart", name)
			}
		}
		return ef.run(ctx, stdout, stderr)
	}
	for _, name := range ef.serveOnly() {
		if flagSet(fl, name) {
			return flagErr(fl, "--%s goes to the enrollment server (netboot --serve): the image holds no secret, the node enrolls for it", name)
		}
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
	if settings.Enroll == "" && *enrollCA != "" {
		refused = append(refused, "--enroll-ca: needs shardfs.enroll=HOST:PORT on the command line, the enrollment server's address")
	}
	if settings.Enroll != "" && *enrollCA == "" {
		refused = append(refused, "shardfs.enroll: needs --enroll-ca, the CA of the enrollment server's certificate")
	}
	if len(settings.Listen) == 0 && settings.Enroll == "" {
		refused = append(refused, "shardfs.listen: missing, and no shardfs.enroll to bring the TLS files for the default "+baremetal.DefaultListen)
	}
	for _, l := range settings.Listen {
		if strings.HasPrefix(l, "tls!") && settings.Enroll == "" {
			refused = append(refused, "shardfs.listen="+l+": needs shardfs.enroll, which brings the TLS files")
		}
	}
	if len(refused) > 0 {
		return fmt.Errorf("--cmdline: the node would refuse to start:\n  %s", strings.Join(refused, "\n  "))
	}
	nb := baremetal.Netboot{Cmdline: *cmdline, CABundle: *caBundle, EnrollCA: *enrollCA}
	if *enrollCA != "" {
		if b, err := os.ReadFile(*enrollCA); err != nil {
			return fmt.Errorf("--enroll-ca: %w", err)
		} else if !x509.NewCertPool().AppendCertsFromPEM(b) || strings.Contains(string(b), "PRIVATE KEY") {
			return fmt.Errorf("--enroll-ca %s: want the CA's certificate alone (PEM), no key", *enrollCA)
		}
	}
	if *caBundle != "" {
		if _, err := os.Stat(*caBundle); err != nil {
			return fmt.Errorf("--ca-bundle: %w (Debian package ca-certificates; or --ca-bundle '' for a node that reaches no TLS server)", err)
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

// checkSecretOwner refuses a secret file owned by another user than me
// or root (attack report 21b, finding 9: a 0600 key or code file of
// another user was taken).
func checkSecretOwner(flagName, name string, fi os.FileInfo, me int) error {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int64(st.Uid) != int64(me) && st.Uid != 0 {
		return fmt.Errorf("%s %s: owned by uid %d, not by uid %d (this process) or root; chown it", flagName, name, st.Uid, me)
	}
	return nil
}

// flagSet reports whether the command line set the flag name.
func flagSet(fl *flag.FlagSet, name string) (set bool) {
	fl.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// checkSecretFile refuses a secret (the token, the TLS key) that is
// missing, empty, that other users can read, or that belongs to another
// user than this process's or root: it should not be exposed on the
// build machine either, and its owner could replace it (an enrollment
// server's key, or its node CA's, of the owner's choosing).
func checkSecretFile(flagName, name string) error {
	fi, err := os.Stat(name)
	if err != nil {
		return fmt.Errorf("%s: %w", flagName, err)
	}
	if err := checkSecretOwner(flagName, name, fi, os.Getuid()); err != nil {
		return err
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
