package main

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// section is one comparison's part of the report.
type section struct {
	number  int
	title   string
	method  []string // paragraphs: what was measured and how
	columns []string // side names, shardfs first
	rows    []row
	extra   []string // further paragraphs or tables, after the main table
	notes   []string // runs that had to be repeated, said after extra
	failed  string
	skipped string
	elapsed time.Duration
}

// row is one measure with the runs of every side.
type row struct {
	measure string
	unit    string
	values  map[string][]float64 // side → runs
	digits  int                  // decimals shown
	ratio   string               // e.g. "1.42×"
	target  string
	met     *bool
}

func (s *section) add(r row) { s.rows = append(s.rows, r) }

func boolp(b bool) *bool { return &b }

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func minMax(v []float64) (lo, hi float64) {
	if len(v) == 0 {
		return math.NaN(), math.NaN()
	}
	return slices.Min(v), slices.Max(v)
}

// num formats a number with thousands separators and the given decimals.
func num(v float64, digits int) string {
	if math.IsNaN(v) {
		return "—"
	}
	s := strconv.FormatFloat(math.Abs(v), 'f', digits, 64)
	intPart, frac, _ := strings.Cut(s, ".")
	var b strings.Builder
	if v < 0 {
		b.WriteByte('-')
	}
	for i, c := range intPart {
		if i > 0 && (len(intPart)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if frac != "" {
		b.WriteString("." + frac)
	}
	return b.String()
}

// cell is a side's runs: median, then min–max, then how many runs.
func cell(v []float64, digits int) string {
	if len(v) == 0 {
		return "—"
	}
	lo, hi := minMax(v)
	if len(v) == 1 {
		return fmt.Sprintf("%s (1 run)", num(v[0], digits))
	}
	return fmt.Sprintf("%s (%s–%s, n=%d)", num(median(v), digits), num(lo, digits), num(hi, digits), len(v))
}

func metText(m *bool) string {
	switch {
	case m == nil:
		return ""
	case *m:
		return "**met**"
	}
	return "**not met**"
}

func render(cfg config, machine string, sections []*section) string {
	var b strings.Builder
	b.WriteString("# shardfs side by side\n\n")
	fmt.Fprintf(&b, "Produced by `%s` on %s.", cfg.command, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	if l := loadText(cfg.loadStart, loadAverage()); l != "" {
		b.WriteString(" " + l)
	}
	b.WriteString("\n\n")
	b.WriteString("## Machine\n\n")
	b.WriteString(machine)
	b.WriteString("\nEvery cell is the median of the runs, then their range (min–max) and count. ")
	b.WriteString("The sides of a comparison ran interleaved (A B A B ...), each side and the gateway simulator in a process of its own, ")
	b.WriteString("memory read from /proc/PID/status (VmRSS) and CPU time from /proc/PID/stat (utime+stime) of that side's process.\n\n")

	b.WriteString("## Summary\n\n| # | measure | shardfs vs peer | target | |\n|---|---|---|---|---|\n")
	for _, s := range sections {
		switch {
		case s.failed != "":
			fmt.Fprintf(&b, "| %d | %s | failed | | **not met** |\n", s.number, s.title)
			continue
		case s.skipped != "":
			fmt.Fprintf(&b, "| %d | %s | skipped | | |\n", s.number, s.title)
			continue
		}
		for _, r := range s.rows {
			if r.target == "" {
				continue
			}
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s |\n", s.number, r.measure, r.ratio, r.target, metText(r.met))
		}
	}
	b.WriteString("\n")

	for _, s := range sections {
		fmt.Fprintf(&b, "## %d. %s\n\n", s.number, s.title)
		if s.skipped != "" {
			fmt.Fprintf(&b, "Skipped: %s\n\n", s.skipped)
			continue
		}
		for _, p := range s.method {
			b.WriteString(p + "\n\n")
		}
		if len(s.rows) > 0 {
			b.WriteString("| measure |")
			for _, c := range s.columns {
				fmt.Fprintf(&b, " %s |", c)
			}
			b.WriteString(" ratio | target | |\n|---|")
			for range s.columns {
				b.WriteString("---|")
			}
			b.WriteString("---|---|---|\n")
			for _, r := range s.rows {
				m := r.measure
				if r.unit != "" {
					m += " (" + r.unit + ")"
				}
				fmt.Fprintf(&b, "| %s |", m)
				for _, c := range s.columns {
					fmt.Fprintf(&b, " %s |", cell(r.values[c], r.digits))
				}
				fmt.Fprintf(&b, " %s | %s | %s |\n", r.ratio, r.target, metText(r.met))
			}
			b.WriteString("\n")
		}
		for _, p := range s.extra {
			b.WriteString(p + "\n\n")
		}
		if len(s.notes) > 0 {
			b.WriteString("Repeated runs: " + strings.Join(s.notes, " ") + "\n\n")
		}
		if s.failed != "" {
			fmt.Fprintf(&b, "**Failed:** %s\n\n", strings.ReplaceAll(s.failed, "\n", " "))
		}
		fmt.Fprintf(&b, "_This comparison took %v._\n\n", s.elapsed.Round(time.Second))
	}
	return b.String()
}

// machineInfo describes the machine and the software compared.
func machineInfo() string {
	var b strings.Builder
	model := "unknown CPU"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := "unknown"
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				if f := strings.Fields(rest); len(f) > 0 {
					kb, _ := strconv.ParseFloat(f[0], 64)
					mem = fmt.Sprintf("%.1f GiB", kb/(1<<20))
				}
			}
		}
	}
	var u syscall.Utsname
	kernel := "unknown"
	if syscall.Uname(&u) == nil {
		kernel = utsString(u.Sysname[:]) + " " + utsString(u.Release[:]) + " " + utsString(u.Machine[:])
	}
	fmt.Fprintf(&b, "- CPU: %d cores (`runtime.NumCPU`), %s\n", runtime.NumCPU(), model)
	fmt.Fprintf(&b, "- Memory: %s\n", mem)
	fmt.Fprintf(&b, "- Kernel: %s\n", kernel)
	fmt.Fprintf(&b, "- Go: %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	deps := map[string]string{}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			deps[d.Path] = d.Version
		}
	}
	fmt.Fprintf(&b, "- Peers: discordgo %s, disgo %s, diod %s; 9P client github.com/hugelgupf/p9 %s\n",
		orUnknown(deps["github.com/bwmarrin/discordgo"]), orUnknown(deps["github.com/disgoorg/disgo"]), diodVersion(), orUnknown(deps["github.com/hugelgupf/p9"]))
	return b.String()
}

func orUnknown(s string) string {
	if s == "" {
		return "(version unknown)"
	}
	return s
}

func utsString(c []int8) string {
	var b []byte
	for _, x := range c {
		if x == 0 {
			break
		}
		b = append(b, byte(x))
	}
	return string(b)
}

// diodVersion asks dpkg, since diod has no version flag.
func diodVersion() string {
	out, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "diod").Output()
	if err != nil || len(out) == 0 {
		if _, err := exec.LookPath("diod"); err != nil {
			return "(not installed)"
		}
		return "(version unknown)"
	}
	return string(out) + " (Debian)"
}

// loadAverage is /proc/loadavg's 1, 5 and 15 minute figures.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// loadText says how busy the machine was during the run.
func loadText(start, end string) string {
	if start == "" || end == "" {
		return ""
	}
	return fmt.Sprintf("Load average (1, 5, 15 min; /proc/loadavg) %s at the start and %s at the end, on %d cores: other work shared the machine, which is why every figure is a median of repeated, interleaved runs.", start, end, runtime.NumCPU())
}

// mdBlock is a part of a report from one "## " heading to the next.
type mdBlock struct {
	heading string // "## 7. ...", or "" for what precedes the first heading
	number  int    // the section's number, 0 if none
	body    string // the heading line included
}

func splitReport(md string) []mdBlock {
	var out []mdBlock
	cur := mdBlock{}
	for _, line := range strings.SplitAfter(md, "\n") {
		if strings.HasPrefix(line, "## ") {
			out = append(out, cur)
			cur = mdBlock{heading: strings.TrimSpace(line)}
			if n, _, ok := strings.Cut(strings.TrimPrefix(cur.heading, "## "), ". "); ok {
				cur.number, _ = strconv.Atoi(n)
			}
		}
		cur.body += line
	}
	return append(out, cur)
}

// summaryNumber is the section number of a summary table row, 0 if the line
// is none.
func summaryNumber(line string) int {
	f := strings.SplitN(line, "|", 3)
	if len(f) < 3 || strings.TrimSpace(f[0]) != "" {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(f[1]))
	return n
}

const footerPrefix = "One full run of the harness took"

// mergeReport puts fresh, a report of some comparisons (numbers), into
// old, an earlier report: their sections and summary rows replace those of
// the same number, the others are kept, and a line after old's first one
// says where the merged sections came from (replacing such a line about
// the same sections).
func mergeReport(old, fresh string, numbers []int, provenance string) string {
	replaced := map[int]bool{}
	for _, n := range numbers {
		replaced[n] = true
	}
	freshBlocks := splitReport(fresh)
	var freshSummary []string
	freshSections := map[int]string{}
	for _, b := range freshBlocks {
		switch {
		case b.heading == "## Summary":
			for _, line := range strings.SplitAfter(b.body, "\n") {
				if n := summaryNumber(line); n > 0 {
					freshSummary = append(freshSummary, line)
				}
			}
		case b.number > 0:
			freshSections[b.number] = b.body
		}
	}
	var out strings.Builder
	footer := ""
	sections := map[int]string{}
	var order []int
	for _, b := range splitReport(old) {
		var kept []string
		for _, line := range strings.SplitAfter(b.body, "\n") {
			if strings.HasPrefix(line, footerPrefix) {
				footer = line
				continue
			}
			kept = append(kept, line)
		}
		body := strings.Join(kept, "")
		switch {
		case b.heading == "":
			var lines []string
			for _, line := range strings.SplitAfter(body, "\n") {
				if strings.HasPrefix(line, "Merged: sections ") && mergedCovered(line, replaced) {
					continue
				}
				lines = append(lines, line)
			}
			body = strings.TrimRight(strings.Join(lines, ""), "\n") + "\n\n" + provenance + "\n\n"
			out.WriteString(body)
		case b.heading == "## Summary":
			var rows []string
			for _, line := range strings.SplitAfter(body, "\n") {
				if n := summaryNumber(line); n > 0 && !replaced[n] {
					rows = append(rows, line)
				} else if line == b.heading+"\n" {
					out.WriteString(line + "\n")
				} else if n == 0 && strings.TrimSpace(line) != "" {
					out.WriteString(line)
				}
			}
			rows = append(rows, freshSummary...)
			slices.SortStableFunc(rows, func(a, b string) int { return summaryNumber(a) - summaryNumber(b) })
			out.WriteString(strings.Join(rows, "") + "\n")
		case b.number > 0:
			if !replaced[b.number] {
				sections[b.number] = body
				order = append(order, b.number)
			}
		default:
			out.WriteString(body)
		}
	}
	for n, body := range freshSections {
		sections[n] = body
		order = append(order, n)
	}
	slices.Sort(order)
	for _, n := range slices.Compact(order) {
		out.WriteString(strings.TrimRight(sections[n], "\n") + "\n\n")
	}
	if footer != "" {
		out.WriteString("\n" + footer)
	}
	return out.String()
}

// mergedCovered reports whether a "Merged: sections 7, 8 from ..." line is
// only about sections in replaced.
func mergedCovered(line string, replaced map[int]bool) bool {
	list, _, _ := strings.Cut(strings.TrimPrefix(line, "Merged: sections "), " from")
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(f), "and ")))
		if err != nil || !replaced[n] {
			return false
		}
	}
	return true
}
