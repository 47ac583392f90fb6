// Command benchtable prints kcheck's benchmark table (`make bench`): for
// each real-size case, the wall time of the Go reference and of a numpy
// float64 implementation of the same computation on the same inputs, their
// ratio, the agreement of the two outputs, GFLOP/s and peak RSS; then a
// Go-only table of MLA decode cost over context length and batch.
//
//	benchtable            full sizes (a few minutes on 2 cores)
//	benchtable -quick     reduced sizes (also KCHECK_BENCH_QUICK=1)
//	benchtable -md FILE   also write the tables as markdown
//
// The Go reference is built twice when the go command is at hand: as every
// build gets it (asm: the AVX-512 assembly inner loops where the CPU has
// them) and with the purego tag (the plain-Go definitions of those loops);
// both must give bit-identical outputs, which the run checks.
// numpy comes from Debian's python3-numpy with libopenblas0-pthread; the
// command installs them when missing and it runs as root. OPENBLAS_CORETYPE
// and OPENBLAS_L2_SIZE, which some machines here set for correctness with
// older OpenBLAS builds, are removed from the numpy run's environment only,
// and the table says which OpenBLAS kernel ran.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kcheck-dev/kcheck/internal/bench"
	"github.com/kcheck-dev/kcheck/internal/npy"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

type childResult struct {
	Seconds    float64 `json:"seconds"`
	CPU        float64 `json:"cpu"`
	RSS        int64   `json:"rss"`
	InputBytes int64   `json:"input_bytes"`
}

type npResult struct {
	Seconds    float64 `json:"seconds"`
	CPU        float64 `json:"cpu"`
	RSS        int64   `json:"rss"`
	InputBytes int64   `json:"input_bytes"`
	Numpy      string  `json:"numpy"`
	BLAS       string  `json:"blas"`
	Core       string  `json:"core"`
	Config     string  `json:"config"`
	Threads    int     `json:"threads"`
}

type build struct{ tag, exe string }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("benchtable", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", os.Getenv("KCHECK_BENCH_QUICK") != "", "reduced sizes")
	reps := fs.Int("reps", 2, "repetitions of each side, alternated; the minimum is reported")
	only := fs.String("run", "", "regexp: only the cases whose name matches")
	growth := fs.Bool("growth", true, "also run the cost-growth table")
	python := fs.String("python", "/usr/bin/python3", "python with numpy")
	md := fs.String("md", "", "also write the tables as markdown to this file")
	keep := fs.Bool("keep", false, "keep the case directories")
	builds := fs.String("builds", "asm,purego", "Go builds to time (asm: the default build; purego: -tags purego); empty: this binary only")
	child := fs.String("child", "", "(internal) run one case's Go side")
	dir := fs.String("dir", "", "(internal) case directory")
	write := fs.Bool("write", false, "(internal) write the inputs")
	tag := fs.String("tag", "go", "(internal) build tag of the outputs")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *child != "" {
		return runChild(*child, *dir, *tag, *write, *reps, stdout, stderr)
	}
	re, err := regexp.Compile(*only)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	root, err := os.MkdirTemp("", "kcheck-bench-")
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if !*keep {
		defer os.RemoveAll(root)
	}
	bs := goBuilds(root, *builds, stderr)
	haveNumpy := ensureNumpy(*python, stderr)

	var rows []row
	var info npResult
	cases := bench.Cases(*quick)
	if *growth {
		cases = append(cases, bench.GrowthCases(*quick)...)
	}
	start := time.Now()
	for i, c := range cases {
		if !re.MatchString(c.Name) {
			continue
		}
		fmt.Fprintf(stderr, "[%s] %s (%s)\n", time.Since(start).Round(time.Second), c.Name, c.Shape)
		r, inf, err := runCase(c, filepath.Join(root, fmt.Sprint(i)), bs, haveNumpy && c.Kernel != "", *python, *reps)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", c.Name, err)
			return 1
		}
		if inf.Core != "" || inf.BLAS != "" {
			info = inf
		}
		rows = append(rows, r)
	}
	var out bytes.Buffer
	header(&out, bs, info, *quick)
	table(&out, rows, bs, false)
	if *growth {
		fmt.Fprintln(&out)
		table(&out, rows, bs, true)
	}
	stdout.Write(out.Bytes())
	if *md != "" {
		var m bytes.Buffer
		header(&m, bs, info, *quick)
		markdown(&m, rows, bs, false)
		if *growth {
			fmt.Fprintln(&m)
			markdown(&m, rows, bs, true)
		}
		if err := os.WriteFile(*md, m.Bytes(), 0o644); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	return 0
}

// goBuilds compiles this command as the default build and with the purego
// tag, so the table can show both; without a go command it times itself
// only.
func goBuilds(root, spec string, stderr io.Writer) []build {
	self, _ := os.Executable()
	gobin, err := exec.LookPath("go")
	if spec == "" || err != nil || runtime.GOARCH != "amd64" {
		return []build{{"go", self}}
	}
	var bs []build
	for _, t := range strings.Split(spec, ",") {
		exe := filepath.Join(root, "benchtable-"+t)
		args := []string{"build", "-o", exe}
		if t == "purego" {
			args = append(args, "-tags", "purego")
		}
		cmd := exec.Command(gobin, append(args, "./internal/bench/cmd/benchtable")...)
		cmd.Stderr = stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(stderr, "building the %s variant: %v (timing this binary only)\n", t, err)
			return []build{{"go", self}}
		}
		bs = append(bs, build{t, exe})
	}
	return bs
}

// ensureNumpy checks that python imports numpy, installing Debian's
// python3-numpy and libopenblas0-pthread when it does not and we are root.
func ensureNumpy(python string, stderr io.Writer) bool {
	ok := func() bool { return exec.Command(python, "-c", "import numpy").Run() == nil }
	if ok() {
		return true
	}
	if os.Geteuid() != 0 {
		fmt.Fprintf(stderr, "numpy is missing for %s; install it with: sudo apt-get install -y python3-numpy libopenblas0-pthread (numpy columns left empty)\n", python)
		return false
	}
	fmt.Fprintln(stderr, "installing python3-numpy and libopenblas0-pthread")
	install := func() error {
		cmd := exec.Command("apt-get", "install", "-y", "python3-numpy", "libopenblas0-pthread")
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		cmd.Stdout, cmd.Stderr = stderr, stderr
		return cmd.Run()
	}
	if install() != nil {
		up := exec.Command("apt-get", "update")
		up.Stdout, up.Stderr = stderr, stderr
		up.Run()
		install()
	}
	if !ok() {
		fmt.Fprintln(stderr, "numpy still missing: numpy columns left empty")
		return false
	}
	return true
}

type side struct {
	seconds, cpu float64 // wall and CPU (user+system, all threads) of the best run
	rss          int64
}

type row struct {
	c          bench.Case
	inputBytes int64
	goSide     map[string]side
	np         side
	npInput    int64
	hasNP      bool
	maxRel     float64
	normRel    float64
	sameBits   bool
}

func runCase(c bench.Case, dir string, bs []build, withNP bool, python string, reps int) (row, npResult, error) {
	r := row{c: c, goSide: map[string]side{}, hasNP: withNP, sameBits: true}
	var info npResult
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return r, info, err
	}
	cj, _ := json.Marshal(map[string]any{"kernel": c.Kernel, "params": c.Params})
	if err := os.WriteFile(filepath.Join(dir, "case.json"), cj, 0o644); err != nil {
		return r, info, err
	}
	if !withNP {
		bs = bs[:1] // Go-only rows (cost growth) time the main build
	}
	if c.Flops > 50e9 {
		// the biggest cases: one run of each side, and the main build only,
		// keep the table to minutes (the quick run checks the builds agree)
		reps, bs = 1, bs[:1]
	}
	for rep := 0; rep < reps; rep++ {
		for bi, b := range bs {
			args := []string{"-child", c.Name, "-dir", dir, "-tag", b.tag, "-reps", "1"}
			if rep == 0 && bi == 0 && withNP {
				args = append(args, "-write")
			}
			var cr childResult
			if err := runJSON(exec.Command(b.exe, args...), &cr); err != nil {
				return r, info, fmt.Errorf("go (%s): %v", b.tag, err)
			}
			r.inputBytes = cr.InputBytes
			s, seen := r.goSide[b.tag]
			if !seen || cr.Seconds < s.seconds {
				s.seconds, s.cpu = cr.Seconds, cr.CPU
			}
			s.rss = max(s.rss, cr.RSS)
			r.goSide[b.tag] = s
		}
		if withNP {
			cmd := exec.Command(python, filepath.Join(srcDir(), "numpy_ref.py"), dir, "1")
			cmd.Env = withoutOpenBLASOverrides(os.Environ())
			var nr npResult
			if err := runJSON(cmd, &nr); err != nil {
				return r, info, fmt.Errorf("numpy: %v", err)
			}
			if rep == 0 || nr.Seconds < r.np.seconds {
				r.np.seconds, r.np.cpu = nr.Seconds, nr.CPU
			}
			r.np.rss = max(r.np.rss, nr.RSS)
			r.npInput = nr.InputBytes
			info = nr
		}
	}
	// outputs: the builds must agree bit for bit; numpy within rounding
	names, _ := filepath.Glob(filepath.Join(dir, "go_"+bs[0].tag+"_*.npy"))
	r.maxRel, r.normRel = 0, 0
	for _, f := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "go_"+bs[0].tag+"_"), ".npy")
		a, err := readF64(f)
		if err != nil {
			return r, info, err
		}
		for _, b := range bs[1:] {
			o, err := readF64(filepath.Join(dir, "go_"+b.tag+"_"+name+".npy"))
			if err != nil {
				return r, info, err
			}
			for i := range a {
				if math.Float64bits(a[i]) != math.Float64bits(o[i]) {
					r.sameBits = false
					break
				}
			}
		}
		if withNP {
			o, err := readF64(filepath.Join(dir, "np_"+name+".npy"))
			if err != nil {
				return r, info, err
			}
			mr, nr, err := bench.Agreement(a, o)
			if err != nil {
				return r, info, fmt.Errorf("output %s: %v", name, err)
			}
			r.maxRel, r.normRel = max(r.maxRel, mr), max(r.normRel, nr)
		}
	}
	os.RemoveAll(dir) // the inputs can be hundreds of MB
	return r, info, nil
}

func readF64(path string) ([]float64, error) {
	ts, err := npy.ReadFile(path)
	if err != nil {
		return nil, err
	}
	for _, t := range ts {
		return t.Float64s(), nil
	}
	return nil, fmt.Errorf("%s: empty", path)
}

func withoutOpenBLASOverrides(env []string) []string {
	var out []string
	for _, e := range env {
		if strings.HasPrefix(e, "OPENBLAS_CORETYPE=") || strings.HasPrefix(e, "OPENBLAS_L2_SIZE=") {
			continue
		}
		out = append(out, e)
	}
	return out
}

// srcDir is this package's parent directory (internal/bench), where
// numpy_ref.py lives; make bench runs from the repository root.
func srcDir() string {
	if _, err := os.Stat("internal/bench/numpy_ref.py"); err == nil {
		abs, _ := filepath.Abs("internal/bench")
		return abs
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func runJSON(cmd *exec.Cmd, v any) error {
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(errb.String()))
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	return json.Unmarshal([]byte(lines[len(lines)-1]), v)
}

func runChild(name, dir, tag string, write bool, reps int, stdout, stderr io.Writer) int {
	c, ok := bench.Lookup(name)
	if !ok {
		fmt.Fprintf(stderr, "no case %q\n", name)
		return 2
	}
	p, err := c.Build()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if write {
		if err := bench.WriteAll(dir, p.Inputs); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	p.Inputs = nil
	best, bestCPU := math.Inf(1), 0.0
	var outs map[string]bench.Output
	for i := 0; i < max(reps, 1); i++ {
		outs = nil
		t, c := time.Now(), bench.CPUTime()
		outs, err = p.Run()
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		if w := time.Since(t).Seconds(); w < best {
			best, bestCPU = w, bench.CPUTime()-c
		}
	}
	rss := bench.PeakRSS() // before the outputs are encoded
	for n, o := range outs {
		if err := bench.WriteNPY(filepath.Join(dir, "go_"+tag+"_"+n+".npy"), bench.F64Array(o.V, o.Shape...)); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
	}
	json.NewEncoder(stdout).Encode(childResult{Seconds: best, CPU: bestCPU, RSS: rss, InputBytes: p.InputBytes})
	return 0
}

func header(w io.Writer, bs []build, info npResult, quick bool) {
	size := "full sizes"
	if quick {
		size = "quick (reduced) sizes"
	}
	fmt.Fprintf(w, "kcheck bench, %s: %s/%s, %d CPUs (GOMAXPROCS %d), %s\n", size, runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	var tags []string
	for _, b := range bs {
		tags = append(tags, b.tag)
	}
	fmt.Fprintf(w, "Go builds: %s. Go time = the reference as kcheck runs it: exact (float64) AND expected (emulated kernel precision) answers in one call.\n", strings.Join(tags, ", "))
	if info.Numpy != "" {
		core := info.Core
		if core == "" {
			core = "unknown kernel"
		}
		fmt.Fprintf(w, "numpy %s, BLAS %s (OpenBLAS kernel %s, %d threads; OPENBLAS_CORETYPE/L2_SIZE unset for this run). numpy time = float64 answer only.\n", info.Numpy, info.BLAS, core, info.Threads)
	}
	fmt.Fprintln(w, "Times are minima over alternated runs; RSS is each process's peak (VmHWM / ru_maxrss), +in = above its inputs.")
}

func mib(b int64) string { return fmt.Sprintf("%.0f", float64(b)/(1<<20)) }

func table(w io.Writer, rows []row, bs []build, growth bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	emit(rows, bs, growth, func(cells []string) { fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t") })
	tw.Flush()
}

func markdown(w io.Writer, rows []row, bs []build, growth bool) {
	first := true
	emit(rows, bs, growth, func(cells []string) {
		fmt.Fprintln(w, "| "+strings.Join(cells, " | ")+" |")
		if first {
			fmt.Fprintln(w, "|"+strings.Repeat("---|", len(cells)))
			first = false
		}
	})
}

func emit(rows []row, bs []build, growth bool, line func([]string)) {
	main := bs[0].tag
	if !growth {
		h := []string{"case", "shape"}
		for _, b := range bs {
			h = append(h, "Go "+b.tag+" s", "(CPU s)")
		}
		h = append(h, "numpy s", "(CPU s)", "Go/numpy", "(CPU)", "max rel", "norm rel", "Go GFLOP/s", "numpy GFLOP/s", "Go RSS MiB", "+in", "numpy RSS MiB", "+in")
		if len(bs) > 1 {
			h = append(h, "same bits")
		}
		line(h)
	} else {
		line([]string{"growth case", "shape", "Go " + main + " s", "(CPU s)", "ns/token·head", "(CPU)", "GFLOP/s", "inputs MiB", "Go RSS MiB", "+in"})
	}
	for _, r := range rows {
		isGrowth := strings.HasPrefix(r.c.Name, "growth")
		if isGrowth != growth {
			continue
		}
		g := r.goSide[main]
		if growth {
			tokHeads := r.c.Flops / (2 * 1088)
			line([]string{r.c.Name, r.c.Shape, fmt.Sprintf("%.3f", g.seconds), fmt.Sprintf("%.3f", g.cpu), fmt.Sprintf("%.0f", g.seconds/tokHeads*1e9), fmt.Sprintf("%.0f", g.cpu/tokHeads*1e9),
				fmt.Sprintf("%.1f", r.c.Flops/g.seconds/1e9), mib(r.inputBytes), mib(g.rss), mib(g.rss - r.inputBytes)})
			continue
		}
		cells := []string{r.c.Name, r.c.Shape}
		for _, b := range bs {
			if gb, ok := r.goSide[b.tag]; ok {
				cells = append(cells, fmt.Sprintf("%.3f", gb.seconds), fmt.Sprintf("%.3f", gb.cpu))
			} else {
				cells = append(cells, "-", "-")
			}
		}
		if r.hasNP {
			cells = append(cells, fmt.Sprintf("%.3f", r.np.seconds), fmt.Sprintf("%.3f", r.np.cpu),
				fmt.Sprintf("%.2f", g.seconds/r.np.seconds), fmt.Sprintf("%.2f", g.cpu/r.np.cpu),
				fmt.Sprintf("%.1e", r.maxRel), fmt.Sprintf("%.1e", r.normRel),
				fmt.Sprintf("%.1f", r.c.Flops/g.seconds/1e9), fmt.Sprintf("%.1f", r.c.Flops/r.np.seconds/1e9),
				mib(g.rss), mib(g.rss-r.inputBytes), mib(r.np.rss), mib(r.np.rss-r.npInput))
		} else {
			cells = append(cells, "-", "-", "-", "-", "-", "-", fmt.Sprintf("%.1f", r.c.Flops/g.seconds/1e9), "-", mib(g.rss), mib(g.rss-r.inputBytes), "-", "-")
		}
		if len(bs) > 1 {
			if len(r.goSide) > 1 {
				cells = append(cells, fmt.Sprint(r.sameBits))
			} else {
				cells = append(cells, "-")
			}
		}
		line(cells)
	}
}
