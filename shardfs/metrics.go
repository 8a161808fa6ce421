package shardfs

import (
	"bytes"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"

	"github.com/shardfs/shardfs/core"
)

func newRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

var (
	descShards     = prometheus.NewDesc("shardfs_shards", "Local shards by state.", []string{"state"}, nil)
	descState      = prometheus.NewDesc("shardfs_shard_state", "The current state of a shard (one series per shard, value 1).", []string{"shard", "state"}, nil)
	descReconnects = prometheus.NewDesc("shardfs_shard_reconnects_total", "Entries into BACKOFF.", []string{"shard"}, nil)
	descIdentifies = prometheus.NewDesc("shardfs_shard_identifies_total", "Identify attempts.", []string{"shard"}, nil)
	descResumes    = prometheus.NewDesc("shardfs_shard_resumes_total", "Resume attempts.", []string{"shard"}, nil)
	descDispatches = prometheus.NewDesc("shardfs_shard_dispatches_total", "Dispatches received in a session.", []string{"shard"}, nil)
	descSequence   = prometheus.NewDesc("shardfs_shard_sequence", "Last dispatch sequence (absent when none).", []string{"shard"}, nil)
	descLatency    = prometheus.NewDesc("shardfs_shard_heartbeat_latency_seconds", "Last heartbeat round trip.", []string{"shard"}, nil)
	descEpoch      = prometheus.NewDesc("shardfs_shard_session_epoch", "Session epoch: changes with every new session.", []string{"shard"}, nil)
	descLeaseGen   = prometheus.NewDesc("shardfs_shard_lease_generation", "Lease generation (fencing token).", []string{"shard"}, nil)
	descDispEvents = prometheus.NewDesc("shardfs_dispatch_events_total", "Dispatch events written to the dispatch logs.", nil, nil)
	descDispBytes  = prometheus.NewDesc("shardfs_dispatch_bytes_total", "Bytes written to the node's dispatch log.", nil, nil)
	descIdRemain   = prometheus.NewDesc("shardfs_identify_remaining", "Session starts left in the identify budget (absent while the total is unknown).", nil, nil)
)

// eventBuckets span a lifecycle event's handling time, from a
// microsecond (an uncontended lock and a log line) to about a second.
var eventBuckets = prometheus.ExponentialBuckets(1e-6, 2, 21)

// eventSeconds is the histogram behind ObserveEvent, one series per kind,
// resolved once so that an observation does not hash its label.
type eventSeconds struct {
	vec  *prometheus.HistogramVec
	kind map[string]prometheus.Observer
}

func newEventSeconds() *eventSeconds {
	e := &eventSeconds{
		vec: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "shardfs_core_event_seconds",
			Help:    "Time the lifecycle core took to handle an event (failures, READY, RESUMED, timers; not dispatches), waiting for the shard's lock included.",
			Buckets: eventBuckets,
		}, []string{"kind"}),
		kind: map[string]prometheus.Observer{},
	}
	for _, k := range core.EventKinds {
		e.kind[k] = e.vec.WithLabelValues(k)
	}
	return e
}

// ObserveEvent records how long the core took to handle a lifecycle event,
// in /metrics as shardfs_core_event_seconds{kind}. It is meant for
// core.Config.ObserveEvent.
func (t *Tree) ObserveEvent(kind string, d time.Duration) {
	o := t.events.kind[kind]
	if o == nil {
		o = t.events.vec.WithLabelValues(kind)
	}
	o.Observe(d.Seconds())
}

// collector reads a snapshot of the core at every scrape.
type collector struct{ t *Tree }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descShards, descState, descReconnects, descIdentifies, descResumes, descDispatches, descSequence, descLatency, descEpoch, descLeaseGen, descDispEvents, descDispBytes, descIdRemain} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	var byState [core.Stopped + 1]int
	for _, d := range c.t.node.Snapshot(nil) {
		byState[d.State]++
		id := strconv.Itoa(d.Shard)
		ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, 1, id, d.State.String())
		ch <- prometheus.MustNewConstMetric(descReconnects, prometheus.CounterValue, float64(d.Reconnects), id)
		ch <- prometheus.MustNewConstMetric(descIdentifies, prometheus.CounterValue, float64(d.Identifies), id)
		ch <- prometheus.MustNewConstMetric(descResumes, prometheus.CounterValue, float64(d.Resumes), id)
		ch <- prometheus.MustNewConstMetric(descDispatches, prometheus.CounterValue, float64(d.Dispatches), id)
		if d.SequenceValid {
			ch <- prometheus.MustNewConstMetric(descSequence, prometheus.GaugeValue, float64(d.Sequence), id)
		}
		ch <- prometheus.MustNewConstMetric(descLatency, prometheus.GaugeValue, d.Latency.Seconds(), id)
		ch <- prometheus.MustNewConstMetric(descEpoch, prometheus.GaugeValue, float64(d.Epoch), id)
		ch <- prometheus.MustNewConstMetric(descLeaseGen, prometheus.GaugeValue, float64(d.Lease.Generation), id)
	}
	for s, n := range byState {
		ch <- prometheus.MustNewConstMetric(descShards, prometheus.GaugeValue, float64(n), core.State(s).String())
	}
	ch <- prometheus.MustNewConstMetric(descDispEvents, prometheus.CounterValue, float64(c.t.dispatchEvents.Load()))
	ch <- prometheus.MustNewConstMetric(descDispBytes, prometheus.CounterValue, float64(c.t.dispatchBytes.Load()))
	if c.t.cfg.Identify != nil {
		if b := c.t.cfg.Identify(); b.Total > 0 {
			ch <- prometheus.MustNewConstMetric(descIdRemain, prometheus.GaugeValue, float64(b.Remaining))
		}
	}
}

// metrics renders the registry in the Prometheus text format.
func (t *Tree) metrics() []byte {
	mfs, err := t.reg.Gather()
	var b bytes.Buffer
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if e := enc.Encode(mf); e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		b.WriteString("# error: " + err.Error() + "\n")
	}
	return b.Bytes()
}
