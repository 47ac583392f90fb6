package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Usage is what ptxas -v says about one kernel built for one architecture.
type Usage struct {
	Kernel, Arch string
	Registers    int
	Stack        int // bytes of stack frame
	SpillStores  int // bytes
	SpillLoads   int // bytes
	StaticSmem   int // bytes of __shared__ arrays (ptxas's "bytes smem")
}

// The lines of ptxas -v that matter, in the forms of ptxas 11.8 to 13.x:
//
//	ptxas info    : Compiling entry function 'nvfp4_gemm_16x64' for 'sm_120a'
//	ptxas info    : Function properties for nvfp4_gemm_16x64
//	    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//	ptxas info    : Used 92 registers, used 1 barriers, 11520 bytes smem      (13.x)
//	ptxas info    : Used 82 registers, 11520 bytes smem, 400 bytes cmem[0]   (11.8)
//
// A kernel that uses no shared memory has no "bytes smem" at all.
var (
	compilingRE = regexp.MustCompile(`Compiling entry function '([^']+)' for '([^']+)'`)
	propsRE     = regexp.MustCompile(`Function properties for (\S+)`)
	frameRE     = regexp.MustCompile(`(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads`)
	usedRE      = regexp.MustCompile(`Used (\d+) registers`)
	smemRE      = regexp.MustCompile(`(\d+) bytes smem`)
)

// ParsePtxas reads ptxas -v output (any number of runs, any architectures)
// and returns one Usage per kernel and architecture, in the order ptxas
// reported them. Function properties of non-entry functions (device
// functions ptxas did not inline) are ignored: they are part of the entry
// that calls them. A kernel reported twice for one architecture, or a
// "Used" line without its entry, is an error: the log is not what this
// tool understands, and a table built from it would be wrong.
func ParsePtxas(r io.Reader) ([]Usage, error) {
	var out []Usage
	seen := map[string]bool{}
	cur := -1   // index in out of the entry being reported
	props := "" // the function the next stack-frame line belongs to
	haveUsed := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		s := sc.Text()
		if m := compilingRE.FindStringSubmatch(s); m != nil {
			key := m[2] + " " + m[1]
			if seen[key] {
				return nil, fmt.Errorf("line %d: kernel %s reported twice for %s", line, m[1], m[2])
			}
			seen[key] = true
			out = append(out, Usage{Kernel: m[1], Arch: m[2]})
			cur, props, haveUsed = len(out)-1, "", false
			continue
		}
		if m := propsRE.FindStringSubmatch(s); m != nil {
			props = m[1]
			continue
		}
		if m := frameRE.FindStringSubmatch(s); m != nil {
			if cur >= 0 && props == out[cur].Kernel {
				out[cur].Stack, out[cur].SpillStores, out[cur].SpillLoads = atoi(m[1]), atoi(m[2]), atoi(m[3])
			}
			continue
		}
		if m := usedRE.FindStringSubmatch(s); m != nil {
			if cur < 0 || haveUsed {
				return nil, fmt.Errorf("line %d: %q follows no \"Compiling entry function\" line", line, strings.TrimSpace(s))
			}
			out[cur].Registers = atoi(m[1])
			if sm := smemRE.FindStringSubmatch(s); sm != nil {
				out[cur].StaticSmem = atoi(sm[1])
			}
			haveUsed = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, u := range out {
		if u.Registers == 0 {
			return nil, fmt.Errorf("kernel %s for %s has no \"Used N registers\" line", u.Kernel, u.Arch)
		}
	}
	return out, nil
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// PTXFacts are what the PTX says about its kernels that ptxas -v does not:
// the block size each entry is bounded to (__launch_bounds__, .maxntid) and
// the dynamic shared memory the launcher gives it (the `extern "C"
// __device__ int NAME_smem` constants of mla_decode.cu, which run_mla.go
// checks against its own computation at run time).
type PTXFacts struct {
	Threads     map[string]int // entry -> .maxntid product; absent: unbounded
	DynamicSmem map[string]int // entry -> bytes
}

var (
	entryRE   = regexp.MustCompile(`\.entry\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(`)
	maxntidRE = regexp.MustCompile(`^\s*\.maxntid\s+(\d+)\s*,\s*(\d+)\s*,\s*(\d+)`)
	smemVarRE = regexp.MustCompile(`\.global\s+\.align\s+\d+\s+\.[us]32\s+([A-Za-z_][A-Za-z0-9_]*)_smem\s*=\s*(\d+)\s*;`)
)

// ReadPTX reads every *.ptx file of dir.
func ReadPTX(dir string) (PTXFacts, error) {
	f := PTXFacts{Threads: map[string]int{}, DynamicSmem: map[string]int{}}
	files, err := filepath.Glob(filepath.Join(dir, "*.ptx"))
	if err != nil {
		return f, err
	}
	if len(files) == 0 {
		return f, fmt.Errorf("no .ptx file in %s (run make kernels)", dir)
	}
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			return f, err
		}
		parsePTX(string(b), &f)
	}
	return f, nil
}

func parsePTX(text string, f *PTXFacts) {
	cur := ""
	for _, l := range strings.Split(text, "\n") {
		if m := entryRE.FindStringSubmatch(l); m != nil {
			cur = m[1]
			continue
		}
		if m := maxntidRE.FindStringSubmatch(l); m != nil && cur != "" {
			f.Threads[cur] = atoi(m[1]) * atoi(m[2]) * atoi(m[3])
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(l), "{") {
			cur = "" // the body: directives for this entry are over
		}
		if m := smemVarRE.FindStringSubmatch(l); m != nil {
			f.DynamicSmem[m[1]] = atoi(m[2])
		}
	}
}

// Limits are the resources one thread block may use on an architecture.
type Limits struct {
	// SmemOptin is the most shared memory (static plus dynamic) a block may
	// opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin).
	SmemOptin int
	// RegsPerBlock is the register file a block may use (64K 32-bit
	// registers on every architecture built here).
	RegsPerBlock int
}

// ArchLimits, from the CUDA C++ Programming Guide's table of technical
// specifications per compute capability ("Maximum amount of shared memory
// per thread block": 163 KB for 8.0, 227 KB for 9.0 and 10.0, 99 KB for
// 8.6, 8.9 and 12.x; "Maximum number of 32-bit registers per thread
// block": 64K). The arch-specific 'a' targets run on the same parts.
var ArchLimits = map[string]Limits{
	"sm_80":   {SmemOptin: 163 << 10, RegsPerBlock: 64 << 10},
	"sm_90":   {SmemOptin: 227 << 10, RegsPerBlock: 64 << 10},
	"sm_90a":  {SmemOptin: 227 << 10, RegsPerBlock: 64 << 10},
	"sm_100":  {SmemOptin: 227 << 10, RegsPerBlock: 64 << 10},
	"sm_100a": {SmemOptin: 227 << 10, RegsPerBlock: 64 << 10},
	"sm_120":  {SmemOptin: 99 << 10, RegsPerBlock: 64 << 10},
	"sm_120a": {SmemOptin: 99 << 10, RegsPerBlock: 64 << 10},
	"sm_121":  {SmemOptin: 99 << 10, RegsPerBlock: 64 << 10},
	"sm_121a": {SmemOptin: 99 << 10, RegsPerBlock: 64 << 10},
}

// Budgets are the variants that the launcher chooses among by the device's
// shared memory (run_mla.go: the largest MLA decode variant that fits):
// the "_mMT_sST" suffix of a kernel name maps to the opt-in shared memory
// that variant is built to fit (mla_decode.cu's KC_SMEM_FITS lines). Such a
// variant must fit every architecture with at least that much; on smaller
// parts not fitting is by design, because the launcher picks a smaller
// variant there. Every other kernel must fit every architecture.
type Budgets map[string]int

var fitsRE = regexp.MustCompile(`KC_SMEM_FITS\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)\s*;`)

// ReadBudgets reads the KC_SMEM_FITS lines of the .cu files of dir.
func ReadBudgets(dir string) (Budgets, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.cu"))
	if err != nil {
		return nil, err
	}
	b := Budgets{}
	for _, p := range files {
		text, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		for _, m := range fitsRE.FindAllStringSubmatch(string(text), -1) {
			b[fmt.Sprintf("_m%s_s%s", m[1], m[2])] = atoi(m[3])
		}
	}
	return b, nil
}

var variantRE = regexp.MustCompile(`_m\d+_s\d+$`)

// Row is one line of the table: a kernel on an architecture and whether it
// fits there.
type Row struct {
	Usage
	Threads     int // 0: no __launch_bounds__
	DynamicSmem int
	Limit       Limits
	Fits        bool
	Required    bool     // a failure to fit fails the build
	Problems    []string // why the build fails on this row (spills, too big)
	Note        string
}

// TotalSmem is what the block needs in all.
func (r Row) TotalSmem() int { return r.StaticSmem + r.DynamicSmem }

// Judge turns the usages into rows and says which fail the build: any
// spill, a required kernel over its shared memory limit, a block whose
// registers exceed the register file, and an architecture with no known
// limits.
func Judge(us []Usage, ptx PTXFacts, budgets Budgets) []Row {
	rows := make([]Row, 0, len(us))
	for _, u := range us {
		r := Row{Usage: u, Threads: ptx.Threads[u.Kernel], DynamicSmem: ptx.DynamicSmem[u.Kernel]}
		lim, known := ArchLimits[u.Arch]
		if !known {
			r.Problems = append(r.Problems, "no known limits for "+u.Arch)
			rows = append(rows, r)
			continue
		}
		r.Limit = lim
		r.Required = true
		if v := variantRE.FindString(u.Kernel); v != "" {
			if need, ok := budgets[v]; ok && lim.SmemOptin < need {
				r.Required = false
				r.Note = fmt.Sprintf("built for %d KB parts; the launcher picks a smaller variant here", need>>10)
			}
		}
		r.Fits = r.TotalSmem() <= lim.SmemOptin
		if u.SpillStores > 0 || u.SpillLoads > 0 {
			r.Problems = append(r.Problems, fmt.Sprintf("spills %d bytes stored, %d loaded", u.SpillStores, u.SpillLoads))
		}
		if !r.Fits && r.Required {
			r.Problems = append(r.Problems, fmt.Sprintf("needs %d bytes of shared memory, %s allows %d", r.TotalSmem(), u.Arch, lim.SmemOptin))
		}
		if r.Threads > 0 && u.Registers*r.Threads > lim.RegsPerBlock {
			r.Fits = false
			r.Problems = append(r.Problems, fmt.Sprintf("%d registers x %d threads exceed the %d registers of a block", u.Registers, r.Threads, lim.RegsPerBlock))
		}
		rows = append(rows, r)
	}
	archOrder := func(a string) string { // sm_80 < sm_90a < sm_100a < sm_120a
		n := strings.TrimRight(strings.TrimPrefix(a, "sm_"), "abf")
		v, _ := strconv.Atoi(n)
		return fmt.Sprintf("%05d%s", v, a)
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if rows[i].Arch != rows[j].Arch {
			return archOrder(rows[i].Arch) < archOrder(rows[j].Arch)
		}
		return rows[i].Kernel < rows[j].Kernel
	})
	return rows
}

// WriteTable writes the rows as a Markdown table and returns how many
// rows fail the build.
func WriteTable(w io.Writer, rows []Row) int {
	fmt.Fprintln(w, "| arch | kernel | registers | threads | stack B | spill st/ld B | static smem B | dynamic smem B | smem KB / limit KB | fits |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	bad := 0
	for _, r := range rows {
		threads := "-"
		if r.Threads > 0 {
			threads = strconv.Itoa(r.Threads)
		}
		fits := "yes"
		switch {
		case len(r.Problems) > 0:
			fits = "**FAIL**: " + strings.Join(r.Problems, "; ")
			bad++
		case !r.Fits:
			fits = "no (" + r.Note + ")"
		}
		fmt.Fprintf(w, "| %s | %s | %d | %s | %d | %d/%d | %d | %d | %.1f / %d | %s |\n",
			r.Arch, r.Kernel, r.Registers, threads, r.Stack, r.SpillStores, r.SpillLoads,
			r.StaticSmem, r.DynamicSmem, float64(r.TotalSmem())/1024, r.Limit.SmemOptin>>10, fits)
	}
	return bad
}
