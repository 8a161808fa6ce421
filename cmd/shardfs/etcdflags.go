package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/shardfs/shardfs/node"
)

// etcdFlags are serve's flags for a fleet sharing one bot (DESIGN 7.3).
type etcdFlags struct {
	endpoints, bot, node *string
	ttl                  *time.Duration
	ca, cert, key        *string
	fluxerBudget         *int
}

func (e *etcdFlags) register(fl *flag.FlagSet) {
	e.endpoints = fl.String("etcd", "", "etcd client URLs, comma-separated: share the bot's shards with the other nodes through etcd (sessions are kept there too)")
	e.bot = fl.String("bot", "", "with --etcd: the bot's name, the folder of its keys in etcd")
	e.node = fl.String("node", "", "with --etcd: this node's name (default: the host name)")
	e.ttl = fl.Duration("etcd-ttl", 0, "with --etcd: the node's lease; its shards stop by TTL - 1s after the last renewal etcd answered (default 10s)")
	e.ca = fl.String("etcd-ca", "", "with --etcd: CA certificate file of etcd's TLS")
	e.cert = fl.String("etcd-cert", "", "with --etcd: client certificate file")
	e.key = fl.String("etcd-key", "", "with --etcd: client key file")
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
	if *e.endpoints == "" {
		for name, v := range map[string]string{"--bot": *e.bot, "--node": *e.node, "--etcd-ca": *e.ca, "--etcd-cert": *e.cert, "--etcd-key": *e.key} {
			if v != "" {
				return nil, fmt.Errorf("%s needs --etcd", name)
			}
		}
		if *e.ttl != 0 {
			return nil, errors.New("--etcd-ttl needs --etcd")
		}
		if *e.fluxerBudget != 0 {
			return nil, errors.New("--fluxer-identify-budget needs --etcd (a lone node paces Fluxer's whole budget)")
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
	cfg := &node.Etcd{Bot: *e.bot, Node: name, TTL: *e.ttl, FluxerIdentifyBudget: *e.fluxerBudget}
	for _, u := range strings.Split(*e.endpoints, ",") {
		if u = strings.TrimSpace(u); u != "" {
			cfg.Endpoints = append(cfg.Endpoints, u)
		}
	}
	if (*e.cert == "") != (*e.key == "") {
		return nil, errors.New("--etcd-cert and --etcd-key go together")
	}
	if *e.ca != "" || *e.cert != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if *e.ca != "" {
			pem, err := os.ReadFile(*e.ca)
			if err != nil {
				return nil, fmt.Errorf("--etcd-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--etcd-ca %s: no PEM certificate in it", *e.ca)
			}
			tc.RootCAs = pool
		}
		if *e.cert != "" {
			c, err := tls.LoadX509KeyPair(*e.cert, *e.key)
			if err != nil {
				return nil, fmt.Errorf("--etcd-cert/--etcd-key: %w", err)
			}
			tc.Certificates = []tls.Certificate{c}
		}
		cfg.TLS = tc
	}
	return cfg, nil
}
