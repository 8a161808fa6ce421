package soak

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Spread is the minimum, median and maximum of durations.
func Spread(ds []time.Duration) (lo, med, hi time.Duration) {
	if len(ds) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[0], s[len(s)/2], s[len(s)-1]
}

// Table is the report as a Markdown table and a few lines, for logs and
// bench/RESULTS.md.
func (r *Report) Table() string {
	var b strings.Builder
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }
	fmt.Fprintf(&b, "| fault | count | failover min / median / max | bound | repair → every member back and serving (median / max) | identifies / resumes |\n")
	fmt.Fprintf(&b, "|---|---:|---|---|---|---|\n")
	total := 0
	for _, k := range append(slices.Clone(Kinds), ClusterKinds...) {
		if r.Faults[k] == 0 && !slices.Contains(Kinds, k) {
			continue
		}
		total += r.Faults[k]
		fo := "—"
		if ds := r.Failover[k]; len(ds) > 0 {
			lo, med, hi := Spread(ds)
			fo = ms(lo) + " / " + ms(med) + " / " + ms(hi)
		}
		_, rmed, rhi := Spread(r.Recovery[k])
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s / %s | %d / %d |\n", describe[k], r.Faults[k], fo, ms(r.Config.Bound()), ms(rmed), ms(rhi), r.Sessions[k].Identifies, r.Sessions[k].Resumes)
	}
	fmt.Fprintf(&b, "\n%d faults in %v, %d nodes, %d shards, TTL %v, simulator heartbeat %v, etcd members %d.\n",
		total, r.Duration.Round(time.Second), r.Config.Nodes, r.Config.Shards, r.Config.TTL, r.Config.HeartbeatInterval(), r.Config.EtcdMembers)
	var perFault []string
	for _, k := range append([]Kind{EtcdKill}, ClusterKinds...) {
		if n := r.Faults[k]; n > 0 {
			perFault = append(perFault, fmt.Sprintf("%s %.1f (%d over %d)", k, float64(r.Sessions[k].Identifies)/float64(n), r.Sessions[k].Identifies, n))
		}
	}
	if len(perFault) > 0 {
		fmt.Fprintf(&b, "Identifies per etcd fault: %s.\n", strings.Join(perFault, ", "))
	}
	if len(r.Settle) > 0 {
		_, smed, shi := Spread(r.Settle)
		fmt.Fprintf(&b, "Before each etcd kill the soak waited for the identify slots of the last recovery to expire: median %v, max %v.\n", smed.Round(100*time.Millisecond), shi.Round(100*time.Millisecond))
	}
	if len(r.Wakes) > 0 {
		most, copies, lines, replayed, held := Wake{}, 0, 0, 0, 0
		for _, w := range r.Wakes {
			held += w.Held
			if w.Stale > most.Stale || (w.Stale == most.Stale && w.Copies > most.Copies) || most.Node == "" {
				most = w
			}
			copies = max(copies, w.Copies)
			lines += w.Lines
			replayed += w.Replayed
		}
		fmt.Fprintf(&b, "Woken from SIGSTOP (%d pauses): the most events a woken node delivered after its deadline %d (fault %d, %s); the most of its lines on its old sessions that another node delivered too %d; "+
			"its lines since the stop, new sessions included, %d in all; replays of another node's lines on sessions it took up after waking %d; sessions the woken nodes held at their stops, by their last lines, %d.\n",
			len(r.Wakes), most.Stale, most.Fault, most.Node, copies, lines, replayed, held)
	}
	for _, change := range []string{"leave", "join", "etcd"} {
		var n, unbalanced, worstSpread, worstMoves, over, bound int
		var took []time.Duration
		for _, p := range r.Placements {
			if p.Change != change {
				continue
			}
			n++
			if !p.Balanced {
				unbalanced++
			}
			worstSpread = max(worstSpread, p.Max-p.Min)
			worstMoves = max(worstMoves, p.Moves)
			bound = max(bound, p.MoveBound(r.Config.Shards))
			if p.Moves > p.MoveBound(r.Config.Shards) {
				over++
			}
			took = append(took, p.Took)
		}
		if n == 0 {
			continue
		}
		_, tmed, thi := Spread(took)
		what := map[string]string{"leave": "after a leave (the fault took a node away)", "join": "after a join (its repair)", "etcd": "after an etcd fault (nobody came or went)"}[change]
		fmt.Fprintf(&b, "Placement %s: %d times, balanced (every member ⌊N/M⌋ or ⌈N/M⌉) %d times, within %s median, %s max; most shards apart (max − min) %d; most moves %d (⌈N/M⌉ + 1 = %d), over it %d times.\n",
			what, n, n-unbalanced, ms(tmed), ms(thi), worstSpread, worstMoves, bound, over)
	}
	fmt.Fprintf(&b, "Max live sessions of one shard at the gateway: %d. Identifies %d (refused %d), resumes %d (failed %d).\n",
		r.MaxLive, r.Identifies, r.RefusedIdentifies, r.Resumes, r.FailedResumes)
	fmt.Fprintf(&b, "Client frames %d (sender not found %d); after SIGCONT %d; for a shard the sender did not own %d.\n",
		r.Frames, r.UnknownFrames, r.WakeFrames, len(r.ForeignFrames))
	fmt.Fprintf(&b, "Paused nodes' sessions still on an open connection at SIGCONT (silent, not counted live; a frame on one would count): %d.\n", r.QuietAtWake)
	if r.OverBound > 0 {
		fmt.Fprintf(&b, "Failovers or recoveries over the bound of %v (converged within %v): %d.\n", r.Config.Bound(), r.Config.hangBound(), r.OverBound)
	}
	for _, p := range r.Placements {
		if p.Change != "etcd" && p.Moves > p.MoveBound(r.Config.Shards) {
			fmt.Fprintf(&b, "MOVES OVER ⌈N/M⌉ + 1: fault %d (%s), %s: %d moves, %d members, %d to %d shards each.\n", p.Fault, p.Kind, p.Change, p.Moves, p.Members, p.Min, p.Max)
		}
	}
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "VIOLATION: %s\n", v)
	}
	for i, f := range r.ForeignFrames {
		if i == 10 {
			fmt.Fprintf(&b, "... %d more foreign frames\n", len(r.ForeignFrames)-10)
			break
		}
		fmt.Fprintf(&b, "FOREIGN FRAME: %s\n", f)
	}
	return b.String()
}

var describe = map[Kind]string{
	Kill:      "kill -9 of a node (failover: kill → its shards READY elsewhere)",
	Pause:     "SIGSTOP past the TTL, SIGCONT (failover: stop → READY elsewhere)",
	Partition: "node ↔ etcd cut past the TTL, healed (failover: cut → READY elsewhere)",
	EtcdKill:  "kill -9 of etcd, restart on its data",
	Drain:     "drain on /ctl, restart (failover: drain → READY elsewhere)",

	MemberKill:      "kill -9 of an etcd member that does not lead, 2 × TTL, restart",
	LeaderKill:      "kill -9 of the etcd leader (a leader change), 2 × TTL, restart",
	MemberPartition: "an etcd member that does not lead cut off from the others, 2 × TTL, healed",
	LeaderPartition: "the etcd leader cut off from the others (a leader change), 2 × TTL, healed",
}
