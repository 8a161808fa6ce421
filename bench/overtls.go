package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// colShardfsZlib is the column of a shardfs node asking for zlib-stream.
const colShardfsZlib = "shardfs zlib-stream"

// variant is one column of a comparison over TLS: a side's process and how
// it connects.
type variant struct {
	column, side string
	w            wire
}

// peersNoZlib says why the peers run uncompressed in the comparisons over
// TLS.
const peersNoZlib = "Neither peer can ask for zlib-stream: discordgo v0.29.0 dials `?v=9&encoding=json` (wsapi.go, Open) and disgo v0.18.15 `?v=10&encoding=json` (gateway_impl.go, Open), and both inflate every binary message as a zlib stream of its own (`zlib.NewReader` per message: wsapi.go onEvent, gateway_impl.go parseMessage), which is identify's payload compression, not the shared context of zlib-stream. Their Compress option only sets identify's `compress` field, which the simulator ignores, so they run uncompressed (Compress off), doing less work per event than shardfs with zlib-stream."

func runMemoryTLS(cfg config, log io.Writer) (*section, error) {
	cfg.memHeartbeat = cfg.memTLSHeartbeat
	tr, err := newTrust()
	if err != nil {
		return nil, err
	}
	defer tr.remove()
	plain, zlib := wire{trust: tr}, wire{trust: tr, compression: "zlib-stream"}
	vs := []variant{
		{sideShardfs, sideShardfs, plain},
		{colShardfsZlib, sideShardfs, zlib},
		{sideDiscordgo, sideDiscordgo, plain},
		{sideDisgo, sideDisgo, plain},
	}
	sec := &section{columns: []string{sideShardfs, colShardfsZlib, sideDiscordgo, sideDisgo}}
	rssV := map[string][]float64{}
	grV := map[string][]float64{}
	goV := map[string][]float64{}
	for i := range cfg.runs {
		for _, v := range vs {
			m, err := retryRun(sec, log, fmt.Sprintf("run %d of %s", i+1, v.column), func() (memorySample, error) {
				return idleShardsOver(cfg, v.w, v.side, cfg.memShards, nil)
			})
			if err != nil {
				return sec, fmt.Errorf("%s over TLS, %d shards: %w", v.column, cfg.memShards, err)
			}
			rssV[v.column] = append(rssV[v.column], m.rssPerShard)
			grV[v.column] = append(grV[v.column], m.goroutinesPerShard)
			goV[v.column] = append(goV[v.column], m.goPerShard)
			fmt.Fprintf(log, "bench: memory over TLS run %d: %s: %.0f B/shard RSS, %.2f goroutines/shard, %d heartbeats, READY in %v\n",
				i+1, v.column, m.rssPerShard, m.goroutinesPerShard, m.heartbeats, m.openTime.Round(time.Millisecond))
		}
	}
	best := sideDiscordgo
	if median(rssV[sideDisgo]) < median(rssV[best]) {
		best = sideDisgo
	}
	ratio := median(rssV[sideShardfs]) / median(rssV[best])
	sec.add(row{
		measure: fmt.Sprintf("resident memory per READY shard over TLS, %d shards", cfg.memShards), unit: "bytes",
		values: rssV, ratio: fmt.Sprintf("%.2f of %s (1/%.1f)", ratio, best, 1/ratio),
		target: "≤ 0.33 of the best peer", met: boolp(ratio <= 1.0/3),
	})
	peerMin := func(v map[string][]float64) float64 { return min(median(v[sideDiscordgo]), median(v[sideDisgo])) }
	sec.add(row{measure: "goroutines per READY shard over TLS", values: grV, digits: 2,
		ratio: fmt.Sprintf("%.2f", median(grV[sideShardfs])/peerMin(grV))})
	sec.add(row{measure: "Go heap in use + stacks per shard over TLS", unit: "bytes", values: goV,
		ratio: fmt.Sprintf("%.2f", median(goV[sideShardfs])/peerMin(goV))})

	// shardfs alone at the larger scale.
	big := map[string][]float64{}
	bigGr := map[string][]float64{}
	bigGo := map[string][]float64{}
	var openTimes []float64
	for i := range cfg.memBigRuns {
		m, err := retryRun(sec, log, fmt.Sprintf("run %d of shardfs at %d shards", i+1, cfg.memBigShards), func() (memorySample, error) {
			return idleShardsOver(cfg, plain, sideShardfs, cfg.memBigShards, nil)
		})
		if err != nil {
			return sec, fmt.Errorf("shardfs over TLS, %d shards: %w", cfg.memBigShards, err)
		}
		big[sideShardfs] = append(big[sideShardfs], m.rssPerShard)
		bigGr[sideShardfs] = append(bigGr[sideShardfs], m.goroutinesPerShard)
		bigGo[sideShardfs] = append(bigGo[sideShardfs], m.goPerShard)
		openTimes = append(openTimes, m.openTime.Seconds())
		fmt.Fprintf(log, "bench: memory over TLS %d shards run %d: %.0f B/shard RSS, %.2f goroutines/shard, READY in %v\n",
			cfg.memBigShards, i+1, m.rssPerShard, m.goroutinesPerShard, m.openTime.Round(time.Millisecond))
	}
	const bigTarget = 16 << 10
	bigMed := median(big[sideShardfs])
	sec.add(row{
		measure: fmt.Sprintf("resident memory per READY shard over TLS, %d shards (shardfs alone)", cfg.memBigShards), unit: "bytes", values: big,
		ratio: fmt.Sprintf("%.2f of 16 KiB", bigMed/bigTarget), target: "≤ 16 KiB", met: boolp(bigMed <= bigTarget),
	})
	sec.add(row{measure: fmt.Sprintf("goroutines per READY shard over TLS, %d shards", cfg.memBigShards), values: bigGr, digits: 2})
	sec.add(row{measure: fmt.Sprintf("Go heap in use + stacks per shard over TLS, %d shards", cfg.memBigShards), unit: "bytes", values: bigGo})
	sec.add(row{measure: fmt.Sprintf("time until %d shards READY over TLS", cfg.memBigShards), unit: "s", values: map[string][]float64{sideShardfs: openTimes}, digits: 1})

	sec.method = []string{
		fmt.Sprintf("Comparison 2 over TLS. At the start the harness makes a certificate authority (ECDSA P-256) and a certificate for 127.0.0.1 signed by it in a temporary directory; the simulator serves discovery and the gateway with that certificate (gatewaysim.Config.TLS: https:// and wss:// URLs, READY's resume_gateway_url included), " +
			"and every client process, shardfs and the peers alike, trusts the CA through SSL_CERT_FILE (the CA's file) and SSL_CERT_DIR (a directory holding only it), which Go's crypto/x509 reads on Linux in place of the system bundle. " +
			"That is what works for all three without changing how they are set up: shardfs's gateway transport dials with a tls.Config that has no RootCAs and discovers with an http.Client on the default transport, discordgo v0.29.0 uses websocket.DefaultDialer and an http.Client on the default transport, disgo v0.18.15 uses websocket.DefaultDialer; each verifies against the system roots (TestTLSTrust checks that the peers' handshakes fail without the variables). " +
			"Both ends use Go's crypto/tls defaults (TLS 1.3)."),
		fmt.Sprintf("Otherwise as comparison 2: %d shards, max_concurrency %d, heartbeat interval %v (longer than comparison 2's: thousands of TLS handshakes on a loaded machine held a discordgo heartbeat past the simulator's 1.5 intervals once, and its re-identifies were refused), memory read before any shard exists and after every shard is READY and %v more have passed, the same collections before each reading; per shard = the difference / N. "+
			"The `%s` column is a shardfs node asking for compress=zlib-stream (its gateway transport inflates with one deflate context per connection); the target compares the uncompressed shardfs column with the peers, which cannot use zlib-stream (see comparison 8). "+
			"The shardfs-alone rows use N = %d (%d runs).",
			cfg.memShards, cfg.memShards, cfg.memHeartbeat, cfg.memHeartbeat*3/2, colShardfsZlib, cfg.memBigShards, cfg.memBigRuns),
	}

	// One more run of each column, with heap sampling fine enough to sum
	// the heap by package; not in the medians above.
	if !cfg.breakdown {
		return sec, nil
	}
	bd := map[string]map[string]float64{}
	for _, v := range vs {
		bd[v.column] = map[string]float64{}
		if _, err := idleShardsOver(cfg, v.w, v.side, cfg.memShards, bd[v.column]); err != nil {
			return sec, fmt.Errorf("%s over TLS, heap breakdown: %w", v.column, err)
		}
	}
	bigBD := map[string]float64{}
	if _, err := idleShardsOver(cfg, plain, sideShardfs, cfg.memBigShards, bigBD); err != nil {
		return sec, fmt.Errorf("shardfs over TLS, %d shards, heap breakdown: %w", cfg.memBigShards, err)
	}
	items := ""
	for _, v := range vs {
		items += fmt.Sprintf("\n- %s, %d shards: %s", v.column, cfg.memShards, breakdownText(bd[v.column], 6))
	}
	items += fmt.Sprintf("\n- shardfs, %d shards: %s", cfg.memBigShards, breakdownText(bigBD, 6))
	sec.extra = append(sec.extra, fmt.Sprintf("Where the memory goes: the Go heap in use per shard, summed by the package that allocated it (the innermost frame outside the runtime, the standard library's containers and codecs and crypto/tls's ciphers, so that a buffer is charged to the code that asked for it), from one more run of each column with runtime.MemProfileRate = %d, after the measurement; those runs are not in the medians. Heap only: stacks and the runtime's own overhead are the rest of the resident size.%s",
		breakdownRate, items))
	var bounds []string
	if ratio > 1.0/3 {
		own := bd[sideShardfs]
		budget := median(rssV[best]) / 3
		bounds = append(bounds, fmt.Sprintf("The 1/3 target is missed at %d shards: it asks for at most %s B per TLS shard (a third of %s's %s B) and shardfs uses %s B. "+
			"crypto/tls's own state per connection is %s B of shardfs's heap per shard (%s), %.0f%% of that budget, and about the same in %s (%s B): a cost every Go client pays per connection, whatever sits above crypto/tls, and the record and handshake buffers in it are kept for the connection's life by crypto/tls itself. "+
			"Besides it, shardfs's own packages hold %s B per shard, gorilla/websocket %s B, and the heap's in-use spans %s B of room no object takes.",
			cfg.memShards, num(budget, 0), best, num(median(rssV[best]), 0), num(median(rssV[sideShardfs]), 0),
			num(tlsTotal(own), 0), tlsPartsText(own), 100*tlsTotal(own)/budget, best, num(tlsTotal(bd[best]), 0),
			num(shardfsShare(own), 0), num(own["gorilla/websocket"], 0), num(own[unusedKey], 0)))
	}
	if bigMed > bigTarget {
		bounds = append(bounds, fmt.Sprintf("The 16 KiB target is missed at %d shards: %s B resident per TLS shard, %s B of it Go heap and stacks. Of the heap, crypto/tls holds %s B per connection (%s), shardfs's own packages %s B, gorilla/websocket %s B, and the in-use spans hold %s B of room no object takes.",
			cfg.memBigShards, num(bigMed, 0), num(median(bigGo[sideShardfs]), 0), num(tlsTotal(bigBD), 0), tlsPartsText(bigBD),
			num(shardfsShare(bigBD), 0), num(bigBD["gorilla/websocket"], 0), num(bigBD[unusedKey], 0)))
	}
	if z := bd[colShardfsZlib]; len(z) > 0 {
		bounds = append(bounds, fmt.Sprintf("With zlib-stream a connection cannot park (its inflater holds state mid-stream), so it keeps its reader goroutine (%.2f goroutines per shard), and the inflater's window and tables (klauspost/compress/flate: %s B per shard) stay with it: %s B resident per shard against %s B uncompressed.",
			median(grV[colShardfsZlib]), num(z["klauspost/compress/flate"], 0), num(median(rssV[colShardfsZlib]), 0), num(median(rssV[sideShardfs]), 0)))
	}
	if len(bounds) > 0 {
		sec.extra = append(sec.extra, "What bounds it: "+strings.Join(bounds, " "))
	}
	return sec, nil
}

// retryRun runs a measurement and, if it fails, once more, saying so in
// the section: on a loaded machine a run of thousands of TLS connections
// can lose one (a heartbeat held up), which says nothing about memory.
func retryRun(sec *section, log io.Writer, what string, f func() (memorySample, error)) (memorySample, error) {
	m, err := f()
	if err == nil {
		return m, nil
	}
	fmt.Fprintf(log, "bench: %s failed, running it again: %v\n", what, err)
	sec.notes = append(sec.notes, fmt.Sprintf("%s failed and was run again (%s).", what, strings.ReplaceAll(err.Error(), "\n", " ")))
	return f()
}

// shardfsShare sums what shardfs's own packages hold in a breakdown.
func shardfsShare(by map[string]float64) float64 {
	t := 0.0
	for k, v := range by {
		if strings.HasPrefix(k, "shardfs/") {
			t += v
		}
	}
	return t
}

func runDispatchTLS(cfg config, log io.Writer) (*section, error) {
	tr, err := newTrust()
	if err != nil {
		return nil, err
	}
	defer tr.remove()
	plain, zlib := wire{trust: tr}, wire{trust: tr, compression: "zlib-stream"}
	vs := []variant{
		{colShardfsZlib, sideShardfs, zlib},
		{sideShardfs, sideShardfs, plain},
		{sideDiscordgo, sideDiscordgo, plain},
		{sideDisgo, sideDisgo, plain},
	}
	sec := &section{columns: []string{colShardfsZlib, sideShardfs, sideDiscordgo, sideDisgo}}
	perCPU := map[string][]float64{}
	perSec := map[string][]float64{}
	cpuPer := map[string][]float64{}
	for i := range cfg.runs {
		for _, v := range vs {
			t, err := floodClientOver(cfg, v.w, v.side)
			if err != nil {
				return sec, fmt.Errorf("%s over TLS: %w", v.column, err)
			}
			perCPU[v.column] = append(perCPU[v.column], t.perCPUSecond)
			perSec[v.column] = append(perSec[v.column], t.perSecond)
			cpuPer[v.column] = append(cpuPer[v.column], float64(t.cpuPerEvent.Nanoseconds())/1000)
			fmt.Fprintf(log, "bench: dispatch over TLS run %d: %s: %.0f events/CPU-s, %.0f events/s, %v CPU/event\n", i+1, v.column, t.perCPUSecond, t.perSecond, t.cpuPerEvent)
		}
	}
	best := sideDiscordgo
	if median(perCPU[sideDisgo]) > median(perCPU[best]) {
		best = sideDisgo
	}
	ratio := median(perCPU[colShardfsZlib]) / median(perCPU[best])
	sec.add(row{
		measure: "dispatch events per CPU-second of the client over TLS, shardfs with zlib-stream", unit: "events/CPU-s", values: perCPU,
		ratio: fmt.Sprintf("%.2f× %s", ratio, best), target: "≥ 2× the best peer", met: boolp(ratio >= 2),
	})
	sec.add(row{measure: "client CPU per event over TLS", unit: "µs", values: cpuPer, digits: 1,
		ratio: fmt.Sprintf("zlib-stream costs shardfs %.1f µs more per event", median(cpuPer[colShardfsZlib])-median(cpuPer[sideShardfs]))})
	sec.add(row{measure: "events per wall second over TLS (simulator and client share the 2 cores)", unit: "events/s", values: perSec})
	sec.method = []string{
		fmt.Sprintf("Comparison 3 over TLS, with the CA, certificate and trust of comparison 7: each run starts a fresh simulator serving wss:// and a fresh client process with %d shards READY, floods every shard with %d MESSAGE_CREATEs of about 700 bytes after a warm-up of a tenth of that, and reads the client's CPU time (utime+stime) before the flood and once its count has every event. "+
			"The `%s` column is a shardfs node asking for compress=zlib-stream (the simulator deflates each connection's stream at zlib.BestSpeed with a sync flush per message, and the node inflates it before its dispatch logs); the `shardfs` column is the same node uncompressed over TLS. The target compares the zlib-stream column with the best peer. ",
			cfg.dispatchShards, cfg.dispatchPerShard, colShardfsZlib) + peersNoZlib,
	}
	return sec, nil
}
