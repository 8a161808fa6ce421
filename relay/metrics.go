package relay

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	descClients   = prometheus.NewDesc("shardfs_relay_clients", "Relay client sessions, connected or resumable.", nil, nil)
	descConnected = prometheus.NewDesc("shardfs_relay_connected_clients", "Relay clients with a connection.", nil, nil)
	descEvents    = prometheus.NewDesc("shardfs_relay_client_events_total", "Dispatches sent to a relay client.", []string{"client", "shard"}, nil)
	descLag       = prometheus.NewDesc("shardfs_relay_client_lag_events", "Dispatches of the shard a relay client has not read yet.", []string{"client", "shard"}, nil)
	descResumes   = prometheus.NewDesc("shardfs_relay_client_resumes_total", "RESUMEs a relay client made.", []string{"client", "shard"}, nil)
	descCache     = prometheus.NewDesc("shardfs_relay_cache_bytes", "Bytes the relay's cache holds, per kind.", []string{"kind"}, nil)
	descRefused   = prometheus.NewDesc("shardfs_relay_cache_refused_total", "Cache elements left out for the cache's bound.", nil, nil)
)

// Collector returns the relay's metrics, to register with the tree's
// registry.
func (s *Server) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Server }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descClients, descConnected, descEvents, descLag, descResumes, descCache, descRefused} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	clients := s.Clients()
	connected := 0
	for _, ci := range clients {
		if ci.Remote != "-" {
			connected++
		}
		id, shard := strconv.Itoa(ci.ID), strconv.Itoa(ci.Shard)
		ch <- prometheus.MustNewConstMetric(descEvents, prometheus.CounterValue, float64(ci.Events), id, shard)
		ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, float64(ci.Lag), id, shard)
		ch <- prometheus.MustNewConstMetric(descResumes, prometheus.CounterValue, float64(ci.Resumes), id, shard)
	}
	ch <- prometheus.MustNewConstMetric(descClients, prometheus.GaugeValue, float64(len(clients)))
	ch <- prometheus.MustNewConstMetric(descConnected, prometheus.GaugeValue, float64(connected))
	for _, k := range Kinds {
		if s.kinds[k] {
			ch <- prometheus.MustNewConstMetric(descCache, prometheus.GaugeValue, float64(s.bytes.perKind[k].Load()), k)
		}
	}
	ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, float64(s.bytes.refused.Load()))
}
