package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shardfs/shardfs/certs"
	"github.com/shardfs/shardfs/enroll"
	"github.com/shardfs/shardfs/fsrv"
)

// enrollFlags are netboot --serve's: the enrollment server.
type enrollFlags struct {
	serve, cert, key, nodeCA, clientCA, nodeNames *string
	tokenFile, etcdCA, etcdCert, etcdKey          *string
	codeFile                                      *string
	codeTTL                                       *time.Duration
	maxPending                                    *int
	listens                                       listenFlag
}

func (f *enrollFlags) register(fl *flag.FlagSet) {
	f.serve = fl.String("serve", "", "run the enrollment server on HOST:PORT (TLS) instead of writing an image")
	f.cert = fl.String("enroll-cert", "", "--serve: the enrollment server's certificate, from the CA the image carries as --enroll-ca")
	f.key = fl.String("enroll-key", "", "--serve: that certificate's key")
	f.nodeCA = fl.String("node-ca", "", "--serve: the CA that signs the nodes' listener certificates: BASE.crt and BASE.key, as shardfs certs ca writes them (e.g. pki/ca)")
	f.clientCA = fl.String("tls-client-ca", "", "--serve: the CA certificate(s) of the clients the nodes' TLS listeners accept, sent to each node")
	f.nodeNames = fl.String("node-names", "", "--serve: file of the nodes' names, one line each: MAC NAME; a node's listener certificate names NAME (else pxe-MAC) and the address its request came from, never what the node asks for")
	f.tokenFile = fl.String("token-file", "", "--serve: file holding the bot token, sent to each enrolled node")
	f.etcdCA = fl.String("etcd-ca", "", "--serve: etcd's CA certificate, sent to each enrolled node")
	f.etcdCert = fl.String("etcd-cert", "", "--serve: etcd's client certificate, sent to each enrolled node")
	f.etcdKey = fl.String("etcd-key", "", "--serve: the etcd client certificate's key, sent to each enrolled node")
	f.codeFile = fl.String("enroll-code", "", "--serve: file of one-time codes, one line each: MAC-or-NAME [CODE]; a line without a code gets one, printed once on standard output")
	f.codeTTL = fl.Duration("code-ttl", enroll.DefaultCodeTTL, "--serve: how long a one-time code stays good")
	f.maxPending = fl.Int("max-pending", enroll.DefaultMaxPending, "--serve: requests that may wait for approval at once; more are refused")
	fl.Var(&f.listens, "listen", "--serve: the 9P listener of the server's /enroll tree (repeatable; default unix!"+enrollSocket()+")")
}

// serveOnly are the flags that mean nothing without --serve.
func (f *enrollFlags) serveOnly() []string {
	return []string{"enroll-cert", "enroll-key", "node-ca", "tls-client-ca", "node-names", "token-file", "etcd-ca", "etcd-cert", "etcd-key", "enroll-code", "code-ttl", "max-pending", "listen"}
}

// enrollSocket is the default socket of the enrollment server's tree,
// beside serve's.
func enrollSocket() string {
	return strings.TrimSuffix(fsrv.DefaultSocket(), ".sock") + "-enroll.sock"
}

// config reads the files the flags name and checks them.
func (f *enrollFlags) config(stdout io.Writer, now time.Time) (enroll.Config, error) {
	var cfg enroll.Config
	if *f.cert == "" || *f.key == "" || *f.nodeCA == "" || *f.clientCA == "" {
		return cfg, errors.New("--serve needs --enroll-cert, --enroll-key, --node-ca and --tls-client-ca")
	}
	if _, _, err := net.SplitHostPort(*f.serve); err != nil {
		return cfg, fmt.Errorf("--serve %q: want HOST:PORT: %w", *f.serve, err)
	}
	if err := checkSecretFile("--enroll-key", *f.key); err != nil {
		return cfg, err
	}
	var err error
	if cfg.Cert, err = tls.LoadX509KeyPair(*f.cert, *f.key); err != nil {
		return cfg, fmt.Errorf("--enroll-cert, --enroll-key: %w", err)
	}
	if err := checkSecretFile("--node-ca", *f.nodeCA+".key"); err != nil {
		return cfg, err
	}
	if cfg.NodeCA, err = certs.LoadCA(*f.nodeCA); err != nil {
		return cfg, fmt.Errorf("--node-ca: %w", err)
	}
	if cfg.Secrets.ClientCA, err = readPEMCerts("--tls-client-ca", *f.clientCA); err != nil {
		return cfg, err
	}
	if *f.nodeNames != "" {
		if cfg.NodeNames, err = readNodeNames(*f.nodeNames); err != nil {
			return cfg, err
		}
	}
	if *f.tokenFile != "" {
		if err := checkSecretFile("--token-file", *f.tokenFile); err != nil {
			return cfg, err
		}
		b, err := os.ReadFile(*f.tokenFile)
		if err != nil {
			return cfg, err
		}
		cfg.Secrets.Token = strings.TrimSpace(string(b))
	}
	if (*f.etcdCert == "") != (*f.etcdKey == "") {
		return cfg, errors.New("--etcd-cert and --etcd-key go together")
	}
	if *f.etcdCA != "" {
		if cfg.Secrets.EtcdCA, err = readPEMCerts("--etcd-ca", *f.etcdCA); err != nil {
			return cfg, err
		}
	}
	if *f.etcdCert != "" {
		if _, err := tls.LoadX509KeyPair(*f.etcdCert, *f.etcdKey); err != nil {
			return cfg, fmt.Errorf("--etcd-cert, --etcd-key: %w", err)
		}
		if err := checkSecretFile("--etcd-key", *f.etcdKey); err != nil {
			return cfg, err
		}
		if cfg.Secrets.EtcdCert, err = os.ReadFile(*f.etcdCert); err != nil {
			return cfg, err
		}
		if cfg.Secrets.EtcdKey, err = os.ReadFile(*f.etcdKey); err != nil {
			return cfg, err
		}
	}
	if *f.codeFile != "" {
		if cfg.Codes, err = readCodes(*f.codeFile, now.Add(*f.codeTTL), stdout); err != nil {
			return cfg, err
		}
	}
	if *f.maxPending < 1 {
		return cfg, fmt.Errorf("--max-pending %d: want at least 1", *f.maxPending)
	}
	cfg.MaxPending = *f.maxPending
	return cfg, nil
}

// readNodeNames reads --node-names: MAC NAME a line, # comments. The
// enrollment server issues each node's listener certificate for the name
// given for its MAC: the name a node sends is its own choice, and anyone
// on the boot network can send a request.
func readNodeNames(name string) (map[string]string, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("--node-names: %w", err)
	}
	defer f.Close()
	names := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 2 {
			return nil, fmt.Errorf("--node-names %s:%d: want MAC NAME", name, n)
		}
		mac, err := net.ParseMAC(fields[0])
		if err != nil {
			return nil, fmt.Errorf("--node-names %s:%d: %w", name, n, err)
		}
		if !enroll.ValidName(fields[1]) {
			return nil, fmt.Errorf("--node-names %s:%d: %q is not a node name (a-z, 0-9, '-' and '.', at most %d; no wildcard)", name, n, fields[1], enroll.MaxName)
		}
		if _, dup := names[mac.String()]; dup {
			return nil, fmt.Errorf("--node-names %s:%d: %s is named twice", name, n, mac)
		}
		names[mac.String()] = fields[1]
	}
	return names, sc.Err()
}

// sameCA reports whether a certificate of the client CAs (PEM) is the node
// CA's: the nodes' listener certificates would then come from the CA
// that vouches for the operators' clients.
func sameCA(nodeCA *certs.CA, clientCAs []byte) bool {
	for rest := clientCAs; ; {
		var blk *pem.Block
		if blk, rest = pem.Decode(rest); blk == nil {
			return false
		}
		if bytes.Equal(blk.Bytes, nodeCA.Cert.Raw) {
			return true
		}
	}
}

func readPEMCerts(flagName, name string) ([]byte, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flagName, err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s %s: no PEM certificate in it", flagName, name)
	}
	return b, nil
}

// readCodes reads the code file: MAC-or-NAME [CODE] a line, # comments.
// A line without a code gets a new one, written to NAME.issued (mode
// 0600; see writeIssued) for the operator to give to whoever stands at
// the node's console; stdout says where, never the code: under systemd
// stdout is the journal, which keeps it. The file holds codes, so it
// must be readable by its owner only.
func readCodes(name string, expires time.Time, stdout io.Writer) ([]enroll.Code, error) {
	codes, issued, err := readCodeFile(name, expires)
	if err != nil || len(issued) == 0 {
		return codes, err
	}
	if err := writeIssued(name+".issued", issued); err != nil {
		return nil, err
	}
	fmt.Fprintf(stdout, "one-time codes for %d nodes, good until %s: in %s.issued (mode 0600)\n", len(issued), expires.UTC().Format(time.RFC3339), name)
	return codes, nil
}

// writeIssued writes the codes made for the lines without one, a line
// "MAC-or-NAME CODE" each, to a new file of mode 0600: one there before
// (or a link another user put there) is removed first, never written
// through.
func writeIssued(file string, issued []enroll.Code) error {
	if err := os.Remove(file); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("--enroll-code: %w", err)
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("--enroll-code: %w", err)
	}
	var b strings.Builder
	b.WriteString("# one-time codes made by netboot --serve; give each at its node's console, then remove this file\n")
	for _, c := range issued {
		fmt.Fprintf(&b, "%s %s\n", c.For, c.Code)
	}
	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()
		return fmt.Errorf("--enroll-code: %w", err)
	}
	return f.Close()
}

// readCodeFile reads the code file; issued are the codes it made.
func readCodeFile(name string, expires time.Time) (codes, issued []enroll.Code, err error) {
	if fi, err := os.Stat(name); err != nil {
		return nil, nil, fmt.Errorf("--enroll-code: %w", err)
	} else if err := checkSecretOwner("--enroll-code", name, fi, os.Getuid()); err != nil {
		return nil, nil, err
	} else if fi.Mode().Perm()&0o077 != 0 {
		return nil, nil, fmt.Errorf("--enroll-code %s: mode %04o lets other users read it; chmod 600 it", name, fi.Mode().Perm())
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, nil, fmt.Errorf("--enroll-code: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		switch len(fields) {
		case 0:
			continue
		case 1:
			code, err := enroll.NewCode()
			if err != nil {
				return nil, nil, err
			}
			fields = append(fields, code)
			issued = append(issued, enroll.Code{For: fields[0], Code: code, Expires: expires})
		case 2:
			if why := enroll.WeakCode(fields[1]); why != "" {
				return nil, nil, fmt.Errorf("--enroll-code %s:%d: the code for %s is too easy to guess (%s); leave it out and one is made", name, n, fields[0], why)
			}
		default:
			return nil, nil, fmt.Errorf("--enroll-code %s:%d: want MAC-or-NAME [CODE]", name, n)
		}
		codes = append(codes, enroll.Code{For: fields[0], Code: fields[1], Expires: expires})
	}
	return codes, issued, sc.Err()
}

// run serves enrollment requests and the /enroll tree until ctx ends.
func (f *enrollFlags) run(ctx context.Context, stdout, stderr io.Writer) error {
	// The server holds the token and the node CA's key: as serve does,
	// keep them out of core dumps and out of reach of ptrace and
	// /proc/PID/mem for other processes of the same user, before they are
	// read.
	if err := notDumpable(); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	cfg, err := f.config(stdout, time.Now())
	if err != nil {
		return err
	}
	cfg.Logger = log
	if sameCA(cfg.NodeCA, cfg.Secrets.ClientCA) {
		log.Warn("--node-ca is also a --tls-client-ca: the CA that signs the nodes' listener certificates should be another than the one of the operators' clients (see doc/baremetal.md)")
	}
	srv, err := enroll.New(cfg)
	if err != nil {
		return err
	}
	listens := []string(f.listens)
	if len(listens) == 0 {
		listens = []string{"unix!" + enrollSocket()}
	}
	ls, err := fsrv.Open(listens, fsrv.TLSFiles{})
	if err != nil {
		return err
	}
	el, err := net.Listen("tcp", *f.serve)
	if err != nil {
		ls.Close()
		return fmt.Errorf("--serve: %w", err)
	}
	tree := &fsrv.Server{Root: fsrv.NewDir("", srv.Dir()), Logger: log.With("component", "9p")}
	log.Info("enrollment server", "addr", el.Addr().String(), "codes", len(cfg.Codes), "max_pending", cfg.MaxPending)
	for _, l := range ls.List {
		log.Info("serving /enroll over 9P", "addr", fsrv.AddrString(l), "access", fsrv.Access(l))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(ls.List)+1)
	wg.Go(func() {
		// The enrollment listener failing ends the server: it would
		// otherwise serve a tree nobody can enroll through.
		if errs[0] = srv.Serve(ctx, el); errs[0] != nil {
			cancel()
		}
	})
	for i, l := range ls.List {
		wg.Go(func() {
			if err := tree.Serve(ctx, l); err != nil && !errors.Is(err, fsrv.ErrServerClosed) {
				errs[i+1] = err
			}
		})
	}
	<-ctx.Done()
	err = tree.Close()
	wg.Wait()
	return errors.Join(append(errs, err)...)
}
