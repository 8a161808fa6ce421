package supervisor

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"sync"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/proto"
)

// metrics is /metrics: every child's families merged, each sample with a
// child label (a family may appear once in an exposition, so the
// children's texts cannot just be joined), and the parent's own:
// shardfs_supervisor_children by state, shardfs_supervisor_restarts_total
// shardfs_supervisor_hangs_total and shardfs_supervisor_gaps_total by
// child, and shardfs_supervisor_silent_seconds of each child that has a
// process. A child that does not answer is left out of that read.
func (t *Tree) metrics() []byte {
	all := map[string]*dto.MetricFamily{}
	// Every child at once: a hung one costs the timeout once, not the
	// others' turns.
	texts := make([][]byte, len(t.cfg.Assignment.Blocks))
	var wg sync.WaitGroup
	for i := range t.cfg.Assignment.Blocks {
		wg.Go(func() {
			if b, err := t.read(i, "metrics"); err == nil {
				texts[i] = b
			}
		})
	}
	wg.Wait()
	for i, blk := range t.cfg.Assignment.Blocks {
		b := texts[i]
		if b == nil {
			continue
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
		if err != nil {
			t.log.Warn("a child's /metrics does not parse; left out", "child", blk.ID, "err", err)
			continue
		}
		for name, f := range fams {
			for _, m := range f.Metric {
				m.Label = append(m.Label, &dto.LabelPair{Name: proto.String("child"), Value: proto.String(blk.ID)})
			}
			if have := all[name]; have != nil && have.GetType() == f.GetType() {
				have.Metric = append(have.Metric, f.Metric...)
			} else if have == nil {
				all[name] = f
			}
		}
	}
	children := t.cfg.Supervisor.Children()
	byState := map[State]int{}
	gauge, counter := dto.MetricType_GAUGE, dto.MetricType_COUNTER
	states := &dto.MetricFamily{Name: proto.String("shardfs_supervisor_children"), Help: proto.String("Children by state."), Type: &gauge}
	restarts := &dto.MetricFamily{Name: proto.String("shardfs_supervisor_restarts_total"), Help: proto.String("Starts of a child after its first."), Type: &counter}
	t.mu.Lock()
	gapsBy := maps.Clone(t.gaps)
	t.mu.Unlock()
	gaps := &dto.MetricFamily{Name: proto.String("shardfs_supervisor_gaps_total"), Help: proto.String("Gap lines: lines a child's log dropped before they were copied to the parent."), Type: &counter}
	hangs := &dto.MetricFamily{Name: proto.String("shardfs_supervisor_hangs_total"), Help: proto.String("Kills of a child by the watchdog."), Type: &counter}
	silent := &dto.MetricFamily{Name: proto.String("shardfs_supervisor_silent_seconds"), Help: proto.String("Seconds since a child's process last spoke on its control stream (it pushes at least every second)."), Type: &gauge}
	for _, c := range children {
		byState[c.State]++
		label := []*dto.LabelPair{{Name: proto.String("child"), Value: proto.String(c.ID)}}
		restarts.Metric = append(restarts.Metric, &dto.Metric{Label: label, Counter: &dto.Counter{Value: proto.Float64(float64(c.Restarts))}})
		hangs.Metric = append(hangs.Metric, &dto.Metric{Label: label, Counter: &dto.Counter{Value: proto.Float64(float64(c.Hangs))}})
		gaps.Metric = append(gaps.Metric, &dto.Metric{Label: label, Counter: &dto.Counter{Value: proto.Float64(float64(gapsBy[c.ID]))}})
		if c.Pid != 0 {
			silent.Metric = append(silent.Metric, &dto.Metric{Label: label, Gauge: &dto.Gauge{Value: proto.Float64(c.Silent.Seconds())}})
		}
	}
	for _, st := range childStates {
		states.Metric = append(states.Metric, &dto.Metric{
			Label: []*dto.LabelPair{{Name: proto.String("state"), Value: proto.String(string(st))}},
			Gauge: &dto.Gauge{Value: proto.Float64(float64(byState[st]))},
		})
	}
	all[states.GetName()], all[restarts.GetName()], all[hangs.GetName()], all[gaps.GetName()] = states, restarts, hangs, gaps
	if len(silent.Metric) > 0 {
		all[silent.GetName()] = silent
	}
	var out bytes.Buffer
	for _, name := range slices.Sorted(maps.Keys(all)) {
		if _, err := expfmt.MetricFamilyToText(&out, all[name]); err != nil {
			fmt.Fprintf(&out, "# %s: %v\n", name, err)
		}
	}
	return out.Bytes()
}
