package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/shardfs/shardfs/node"
)

// etcdConn are the flags that reach etcd: endpoints, TLS and the user
// (serve, and fleet plan).
type etcdConn struct {
	endpoints, ca, cert, key *string
	user, passwordFile       *string
	insecure                 *bool
}

// etcdPasswordEnv holds the password of --etcd-user when no
// --etcd-password-file is given.
const etcdPasswordEnv = "SHARDFS_ETCD_PASSWORD"

func (c *etcdConn) register(fl *flag.FlagSet) {
	c.endpoints = fl.String("etcd", "", "etcd client URLs, comma-separated: share the bot's shards with the other nodes through etcd (sessions are kept there too)")
	c.ca = fl.String("etcd-ca", "", "with --etcd: CA certificate file of etcd's TLS")
	c.cert = fl.String("etcd-cert", "", "with --etcd: client certificate file")
	c.key = fl.String("etcd-key", "", "with --etcd: client key file")
	c.user = fl.String("etcd-user", "", "with --etcd: etcd user (its role: read-write on /shardfs/BOT/ only); the password from --etcd-password-file or "+etcdPasswordEnv)
	c.passwordFile = fl.String("etcd-password-file", "", "with --etcd-user: file holding the etcd user's password")
	c.insecure = fl.Bool("etcd-insecure", false, "with --etcd: allow plain http:// to etcd beyond loopback (session ids then travel in clear, and anyone on the path can write ownership keys)")
}

// unused names the connection flags given without --etcd, or "".
func (c *etcdConn) unused() string {
	for _, f := range []struct{ name, v string }{{"--etcd-ca", *c.ca}, {"--etcd-cert", *c.cert}, {"--etcd-key", *c.key}, {"--etcd-user", *c.user}, {"--etcd-password-file", *c.passwordFile}} {
		if f.v != "" {
			return f.name
		}
	}
	if *c.insecure {
		return "--etcd-insecure"
	}
	return ""
}

// config fills cfg's endpoints, TLS and credentials, refusing plain
// http:// beyond loopback unless --etcd-insecure.
func (c *etcdConn) config(cfg *node.Etcd) error {
	for _, u := range strings.Split(*c.endpoints, ",") {
		if u = strings.TrimSpace(u); u != "" {
			cfg.Endpoints = append(cfg.Endpoints, u)
		}
	}
	if (*c.cert == "") != (*c.key == "") {
		return errors.New("--etcd-cert and --etcd-key go together")
	}
	if *c.ca != "" || *c.cert != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if *c.ca != "" {
			pem, err := os.ReadFile(*c.ca)
			if err != nil {
				return fmt.Errorf("--etcd-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return fmt.Errorf("--etcd-ca %s: no PEM certificate in it", *c.ca)
			}
			tc.RootCAs = pool
		}
		if *c.cert != "" {
			kp, err := tls.LoadX509KeyPair(*c.cert, *c.key)
			if err != nil {
				return fmt.Errorf("--etcd-cert/--etcd-key: %w", err)
			}
			tc.Certificates = []tls.Certificate{kp}
		}
		cfg.TLS = tc
	}
	if !*c.insecure {
		for _, ep := range cfg.Endpoints {
			if plainBeyondLoopback(ep, cfg.TLS != nil) {
				return fmt.Errorf("--etcd %s: plain http to another host sends session ids in clear and lets anyone on the path write the bot's ownership keys; use https:// (with --etcd-ca), or --etcd-insecure on a network you trust", ep)
			}
		}
	}
	if *c.passwordFile != "" && *c.user == "" {
		return errors.New("--etcd-password-file needs --etcd-user")
	}
	if *c.user != "" {
		cfg.Username = *c.user
		// Like the token: no process of this user may read it out of
		// this one's memory from here on.
		if err := notDumpable(); err != nil {
			return err
		}
		if *c.passwordFile != "" {
			b, err := readSecretFile("--etcd-password-file", *c.passwordFile, os.Getuid())
			if err != nil {
				return err
			}
			cfg.Password = strings.TrimRight(string(b), "\r\n")
		} else {
			pw, ok := os.LookupEnv(etcdPasswordEnv)
			if !ok {
				return fmt.Errorf("--etcd-user %s: no password: give --etcd-password-file FILE or set %s", *c.user, etcdPasswordEnv)
			}
			// Not unset: serve re-executes itself to drop SHARDFS_TOKEN
			// after this, and the new image reads it again.
			cfg.Password = pw
		}
		if cfg.Password == "" {
			return fmt.Errorf("--etcd-user %s: the password is empty", *c.user)
		}
	}
	return nil
}

// plainBeyondLoopback reports whether etcd endpoint ep is reached without
// TLS on a host other than loopback. An endpoint without a scheme uses
// TLS when the client has a TLS configuration (etcd's client decides so).
func plainBeyondLoopback(ep string, tlsConfigured bool) bool {
	host := ep
	plain := !tlsConfigured
	if scheme, rest, ok := strings.Cut(ep, "://"); ok {
		switch scheme {
		case "unix", "unixs":
			return false // a socket on this machine
		case "http":
			plain = true
		case "https":
			plain = false
		}
		host = rest
	}
	if !plain {
		return false
	}
	host, _, _ = strings.Cut(host, "/")
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" {
		return false
	}
	ip := net.ParseIP(host)
	return ip == nil || !ip.IsLoopback()
}

// etcdFlags are serve's flags for a fleet sharing one bot (DESIGN 7.3).
type etcdFlags struct {
	conn         etcdConn
	bot, node    *string
	ttl          *time.Duration
	fluxerBudget *int
	confirm      *bool
}

func (e *etcdFlags) register(fl *flag.FlagSet) {
	e.conn.register(fl)
	e.bot = fl.String("bot", "", "with --etcd: the bot's name, the folder of its keys in etcd")
	e.node = fl.String("node", "", "with --etcd: this node's name (default: the host name)")
	e.ttl = fl.Duration("etcd-ttl", 0, "with --etcd: the node's lease; its shards stop by TTL - 1s after the last renewal etcd answered (default 10s)")
	e.confirm = fl.Bool("confirm-delivery", true, "with --etcd: deliver a received event only once etcd has confirmed, in a read begun after it arrived, that this node still holds its lease (one read shared by all shards, about one etcd round trip of latency); false delivers at once, and a node frozen by its hypervisor past its TTL then delivers what it reads after the thaw")
	e.fluxerBudget = fl.Int("fluxer-identify-budget", 0, "with --etcd and --flavor fluxer: this node's share of Fluxer's identify budget per minute, which is per source address; give each of N nodes sharing one address 300/N (default: all 300)")
}

// etcdFlagNames is the set of the etcd flags' names, for the commands
// that take serve's flags but refuse these (supervise).
func etcdFlagNames() map[string]bool {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	new(etcdFlags).register(fs)
	names := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { names[f.Name] = true })
	return names
}

// config returns the node's etcd configuration, or nil without --etcd.
func (e *etcdFlags) config(sessions bool) (*node.Etcd, error) {
	if *e.conn.endpoints == "" {
		for name, v := range map[string]string{"--bot": *e.bot, "--node": *e.node} {
			if v != "" {
				return nil, fmt.Errorf("%s needs --etcd", name)
			}
		}
		if name := e.conn.unused(); name != "" {
			return nil, fmt.Errorf("%s needs --etcd", name)
		}
		if *e.ttl != 0 {
			return nil, errors.New("--etcd-ttl needs --etcd")
		}
		if *e.fluxerBudget != 0 {
			return nil, errors.New("--fluxer-identify-budget needs --etcd (a lone node paces Fluxer's whole budget)")
		}
		if !*e.confirm {
			return nil, errors.New("--confirm-delivery needs --etcd (a lone node confirms with nobody)")
		}
		return nil, nil
	}
	if *e.bot == "" {
		return nil, errors.New("--etcd needs --bot NAME")
	}
	if sessions {
		return nil, errors.New("--sessions and --etcd are exclusive: with --etcd the sessions are kept in etcd")
	}
	if *e.ttl != 0 && *e.ttl < 2*time.Second {
		return nil, fmt.Errorf("--etcd-ttl %v: want at least 2s (etcd's minimum)", *e.ttl)
	}
	name := *e.node
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("--node not given and no host name: %w", err)
		}
		name = h
	}
	if *e.fluxerBudget < 0 {
		return nil, fmt.Errorf("--fluxer-identify-budget %d: want a count of identifies per minute, 1 or more", *e.fluxerBudget)
	}
	cfg := &node.Etcd{Bot: *e.bot, Node: name, TTL: *e.ttl, FluxerIdentifyBudget: *e.fluxerBudget, Unconfirmed: !*e.confirm}
	if err := e.conn.config(cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}
