package bench

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// The whole-check table (issue 17): each kernel's real-size capture, written
// by `kcheck run --out` from a case file (the reference backend for the
// passing capture, a planted fault, `--backend faulty:NAME`, for the
// failing one), is checked end to end by the `kcheck check` binary, by the
// numpy check a user would write (numpy_checks.py, beside this file) and by
// the single-core read limit of the same file (cmd/readlimit), one child
// process each, timed alternately on the page-cached file. Everything here
// drives binaries and files, not kcheck's Go API, so that the table measures
// any kcheck build the same way.

// Size is the scale of a whole-check capture.
type Size int

const (
	Tiny  Size = iota // a few KB: the harness's own test
	Quick             // tens of MB: make bench BENCHFLAGS=-quick
	Full              // the real sizes: 0.6-0.7 GB cache captures
)

// WholeSpec is one kernel's capture in the whole-check table.
type WholeSpec struct {
	Name  string                    // row name: kernel and cache dtype
	Case  func(Size) map[string]any // the case (cases/ JSON fields, without the name)
	Shape func(Size) string         // the size in words
	Fault string                    // `kcheck faults` name planted in the failing capture; "" for none
	// Bytes is about the size of the capture (its tensors), for the disk
	// check before captures are made.
	Bytes func(Size) int64
}

func requests(n, tokens int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = tokens
	}
	return s
}

// cacheSpec is a kv_cache_write or kv_cache_gather over a P = 64 cache of
// kind, batch requests of 32K tokens at the full size (2K quick): a
// prefill's write of every token, or a decode step's gather of every page.
func cacheSpec(kernel, kind string, batch int) WholeSpec {
	tokens := map[Size]int{Tiny: 100, Quick: 2048, Full: 32768}
	return WholeSpec{
		Name: kernel + " " + kind,
		Case: func(s Size) map[string]any {
			b := batch
			if s == Tiny {
				b = 2
			}
			return map[string]any{"kernel": kernel, "batch": b, "seq_lens": requests(b, tokens[s]), "page_size": 64, "kv_cache_dtype": kind, "seed": 17}
		},
		Shape: func(s Size) string {
			b := batch
			if s == Tiny {
				b = 2
			}
			return fmt.Sprintf("%d x %d tokens, P=64", b, tokens[s])
		},
		Fault: "page_boundary_off_by_one",
		Bytes: func(s Size) int64 {
			b := batch
			if s == Tiny {
				b = 2
			}
			n := int64(b * tokens[s])
			entry := map[string]int64{"bf16": 1152, "fp8_e4m3": 576, "fp8_ds_mla": 656}[kind]
			slots := n + int64(b+2)*64 // whole pages and the two spare blocks
			if kernel == "kv_cache_write" {
				return 2*slots*entry + n*(1152+8) // before and after, kv_c and k_pe, slot_mapping
			}
			return slots*entry + n*1152 // the cache and the bf16 rows gathered
		},
	}
}

// WholeSpecs lists the table's kernels.
func WholeSpecs() []WholeSpec {
	ctx := map[Size]int{Tiny: 300, Quick: 8192, Full: 131072}
	combineBatch := map[Size]int{Tiny: 1, Quick: 1, Full: 16}
	combineSplits := map[Size]int{Tiny: 8, Quick: 64, Full: 64}
	rows := map[Size]int{Tiny: 128, Quick: 256, Full: 2048}
	cols := map[Size]int{Tiny: 256, Quick: 7168, Full: 7168}
	gemmM := map[Size]int{Tiny: 16, Quick: 32, Full: 256}
	gemmN := map[Size]int{Tiny: 128, Quick: 2048, Full: 2048}
	nvfp4 := func(kernel, layout string) WholeSpec {
		return WholeSpec{
			Name: kernel,
			Case: func(s Size) map[string]any {
				return map[string]any{"kernel": kernel, "m": rows[s], "k": cols[s], "seed": 17, "params": map[string]string{"scale_layout": layout}}
			},
			Shape: func(s Size) string { return fmt.Sprintf("%dx%d, %s scales", rows[s], cols[s], layout) },
			Fault: "nibble_order",
			Bytes: func(s Size) int64 { return int64(rows[s]) * int64(cols[s]) * (2 + 1 + 1) / 2 }, // bf16, codes, scales
		}
	}
	return []WholeSpec{
		cacheSpec("kv_cache_write", "bf16", 6),
		cacheSpec("kv_cache_write", "fp8_e4m3", 8),
		cacheSpec("kv_cache_write", "fp8_ds_mla", 8),
		cacheSpec("kv_cache_gather", "bf16", 8),
		cacheSpec("kv_cache_gather", "fp8_e4m3", 12),
		cacheSpec("kv_cache_gather", "fp8_ds_mla", 12),
		{
			Name: "mla_decode bf16",
			Case: func(s Size) map[string]any {
				tp := 1
				if s == Tiny {
					tp = 8
				}
				return map[string]any{"kernel": "mla_decode", "preset": "deepseek-v3", "tp": tp, "batch": 1, "seq_lens": []int{ctx[s]}, "page_size": 64, "kv_cache_dtype": "bf16", "seed": 17}
			},
			Shape: func(s Size) string { return fmt.Sprintf("deepseek-v3 B=1 H=128 ctx=%d", ctx[s]) },
			Fault: "heads_swapped",
			Bytes: func(s Size) int64 { return int64(ctx[s]+3*64)*1152 + 128*(1152+1024+4) },
		},
		{
			Name: "splitk_combine",
			Case: func(s Size) map[string]any {
				return map[string]any{"kernel": "splitk_combine", "preset": "kimi-k2", "batch": combineBatch[s], "splits": combineSplits[s], "seed": 17}
			},
			Shape: func(s Size) string {
				return fmt.Sprintf("%dx%dx512", 64*combineBatch[s], combineSplits[s])
			},
			Fault: "unweighted_average",
			Bytes: func(s Size) int64 {
				n := int64(64 * combineBatch[s])
				return n*int64(combineSplits[s])*(512+1)*4 + n*(1024+4)
			},
		},
		nvfp4("nvfp4_dequantize", "linear"),
		nvfp4("nvfp4_quantize", "swizzled_128x4"),
		{
			Name: "nvfp4_gemm",
			Case: func(s Size) map[string]any {
				return map[string]any{"kernel": "nvfp4_gemm", "m": gemmM[s], "n": gemmN[s], "k": cols[s], "seed": 17, "params": map[string]string{"scale_layout": "swizzled_128x4"}}
			},
			Shape: func(s Size) string { return fmt.Sprintf("M=%d N=%d K=%d", gemmM[s], gemmN[s], cols[s]) },
			Fault: "nibble_order",
			Bytes: func(s Size) int64 {
				return int64(gemmM[s]+gemmN[s])*int64(cols[s])*9/16 + int64(gemmM[s]*gemmN[s])*2
			},
		},
	}
}

// Capture is one file of the table: a spec's case at one size, written by
// one backend, and the verdict it must get.
type Capture struct {
	Spec    WholeSpec
	Size    Size
	Backend string // "reference" or "faulty:NAME"
	Want    string // "pass" or "fail"
	Path    string // set by Store.Ensure
}

// Name is the capture's case name, as `kcheck run --out` names its file.
func (c Capture) Name() string {
	// The size is in the name, so that a quick run does not replace the
	// full captures of the same case (Ensure removes other keys' files).
	n := "bench17-" + map[Size]string{Tiny: "tiny-", Quick: "quick-"}[c.Size] + strings.ReplaceAll(c.Spec.Name, " ", "-")
	if c.Want == "fail" {
		n += "-faulty"
	}
	return n
}

// Row is the table's row name.
func (c Capture) Row() string {
	if c.Want == "fail" {
		return c.Spec.Name + ", fail (" + c.Spec.Fault + ")"
	}
	return c.Spec.Name + ", pass"
}

// CaseJSON is the case file `kcheck run --cases` reads for this capture.
func (c Capture) CaseJSON() []byte {
	cs := map[string]any{"name": c.Name()}
	for k, v := range c.Spec.Case(c.Size) {
		cs[k] = v
	}
	b, _ := json.Marshal(map[string]any{"cases": []any{cs}}) // maps marshal with sorted keys
	return b
}

// Captures lists every capture of specs at size s: each spec passing, and
// failing with its planted fault.
func Captures(specs []WholeSpec, s Size) []Capture {
	var out []Capture
	for _, sp := range specs {
		out = append(out, Capture{Spec: sp, Size: s, Backend: "reference", Want: "pass"})
		if sp.Fault != "" {
			out = append(out, Capture{Spec: sp, Size: s, Backend: "faulty:" + sp.Fault, Want: "fail"})
		}
	}
	return out
}

// GeneratorPackages are the packages whose code decides a capture's bytes:
// the case builder, the backends, the kernel families (their adapters,
// generators and planted faults, with the references they import) and the
// file writer. Their sources are hashed into each capture's key, so a
// change there makes new captures and a change anywhere else (the checker
// above all) reuses the old ones. The
// command line around them (internal/cli) is not hashed; `make bench-clean`
// drops every capture.
var GeneratorPackages = []string{"./cases", "./internal/backend", "./internal/faults", "./internal/kernels/all", "./internal/safetensors"}

// GeneratorHash hashes the Go and embedded files of GeneratorPackages and
// of every package of this module they import, run in the module's root.
func GeneratorHash(root string) (string, error) {
	args := append([]string{"list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}\t{{join .GoFiles \",\"}}\t{{join .EmbedFiles \",\"}}{{end}}"}, GeneratorPackages...)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	var errb bytes.Buffer
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list of the capture generator's packages %v: %v: %s (update bench.GeneratorPackages if they moved)", GeneratorPackages, err, strings.TrimSpace(errb.String()))
	}
	var files []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 3 || !strings.HasPrefix(f[0], root) {
			continue // outside the module: the standard library and go.sum's versions
		}
		for _, names := range f[1:] {
			for _, n := range strings.Split(names, ",") {
				if n != "" {
					files = append(files, filepath.Join(f[0], n))
				}
			}
		}
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		rel, _ := filepath.Rel(root, f)
		fmt.Fprintf(h, "%s %d\n", rel, len(b))
		h.Write(b)
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		b, _ := os.ReadFile(filepath.Join(root, f))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// captureFormat is bumped when the way captures are made here changes.
const captureFormat = "kcheck-bench17-capture-1"

// Key identifies a capture's bytes: the case, the backend and the generator.
func (c Capture) Key(generator string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n", captureFormat, c.Backend, generator)
	h.Write(c.CaseJSON())
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Manifest is what the store records beside a capture it made.
type Manifest struct {
	Case      json.RawMessage `json:"case"`
	Backend   string          `json:"backend"`
	Generator string          `json:"generator"`
	Bytes     int64           `json:"bytes"`
	Sum       uint64          `json:"sum"` // bench.SumBytes of the file, checked by every read-limit run
	Kcheck    string          `json:"kcheck_version"`
	Made      string          `json:"made"`
	Seconds   float64         `json:"seconds"` // what `kcheck run` took to make it (inputs, backend, its check)
}

// Store keeps captures in Dir, one file and a manifest each, named by the
// case and keyed by Capture.Key: a capture is made once and reused by every
// later run until the case or the generator changes.
type Store struct {
	Dir       string
	Kcheck    string // the kcheck binary that writes them (`kcheck run --out`)
	Generator string // GeneratorHash
	Env       []string
	Log       io.Writer
	// KeepFree is how many bytes Ensure leaves free on the captures' disk
	// after making the missing captures: the whole table's captures are
	// tens of GB, and a disk filled to the last byte breaks more than this
	// run. The wholetable command keeps DefaultKeepFree.
	KeepFree int64
}

// DefaultKeepFree is the space the wholetable command keeps free.
const DefaultKeepFree = 2 << 30

func (s *Store) paths(c Capture) (file, manifest, glob string) {
	base := filepath.Join(s.Dir, c.Name())
	file = base + "." + c.Key(s.Generator) + ".safetensors"
	return file, file + ".json", base + ".*.safetensors"
}

// Lookup returns the manifest of c's capture when the store holds it whole.
func (s *Store) Lookup(c Capture) (Manifest, bool) {
	file, man, _ := s.paths(c)
	var m Manifest
	b, err := os.ReadFile(man)
	if err != nil || json.Unmarshal(b, &m) != nil {
		return m, false
	}
	st, err := os.Stat(file)
	return m, err == nil && st.Size() == m.Bytes
}

// Ensure makes every capture of cs that the store lacks, after checking
// that the disk holds them, and sets each Path. Captures of the same case
// under other keys (an older generator) are removed first.
func (s *Store) Ensure(cs []Capture) error {
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return err
	}
	// A run that was stopped while making a capture leaves its work directory.
	if stale, _ := filepath.Glob(filepath.Join(s.Dir, ".making-*")); len(stale) > 0 {
		for _, d := range stale {
			fmt.Fprintf(s.Log, "removing %s (left by a run that was stopped)\n", d)
			os.RemoveAll(d)
		}
	}
	var missing []int
	var need int64
	for i := range cs {
		file, man, glob := s.paths(cs[i])
		cs[i].Path = file
		if _, ok := s.Lookup(cs[i]); ok {
			continue
		}
		olds, _ := filepath.Glob(glob)
		for _, old := range olds {
			if old != file {
				fmt.Fprintf(s.Log, "removing %s (made by another generator or case)\n", old)
				os.Remove(old)
				os.Remove(old + ".json")
			}
		}
		os.Remove(file)
		os.Remove(man)
		missing = append(missing, i)
		need += cs[i].Spec.Bytes(cs[i].Size) * 11 / 10
	}
	if len(missing) == 0 {
		return nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.Dir, &st); err != nil {
		return fmt.Errorf("captures directory %s: %v", s.Dir, err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	if need+s.KeepFree > free {
		return fmt.Errorf("the %d missing captures need about %.1f GB in %s, which has %.1f GB free (and %.1f GB are kept free): free some space, or pass -captures DIR on a larger disk", len(missing), float64(need)/1e9, s.Dir, float64(free)/1e9, float64(s.KeepFree)/1e9)
	}
	fmt.Fprintf(s.Log, "making %d captures (about %.1f GB) in %s with `kcheck run --out`; later runs reuse them\n", len(missing), float64(need)/1e9, s.Dir)
	for _, i := range missing {
		if err := s.make(cs[i]); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) make(c Capture) error {
	file, man, _ := s.paths(c)
	tmp, err := os.MkdirTemp(s.Dir, ".making-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	caseFile := filepath.Join(tmp, "case.json")
	if err := os.WriteFile(caseFile, c.CaseJSON(), 0o644); err != nil {
		return err
	}
	start := time.Now()
	fmt.Fprintf(s.Log, "  %s (%s, %s)\n", c.Name(), c.Spec.Shape(c.Size), c.Backend)
	cmd := exec.Command(s.Kcheck, "run", "--cases", caseFile, "--case", c.Name(), "--backend", c.Backend,
		"--out", filepath.Join(tmp, "out"), "--quiet", "--max-memory", "0", "--timeout", "1h")
	cmd.Env = s.Env
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		return fmt.Errorf("kcheck run for %s: %v", c.Name(), err)
	}
	made := filepath.Join(tmp, "out", c.Name()+".safetensors")
	if code > 1 {
		return fmt.Errorf("kcheck run for %s exited %d: %s", c.Name(), code, tail(out))
	}
	n, sum, err := SumFile(made)
	if err != nil {
		return fmt.Errorf("kcheck run for %s wrote no capture: %v (%s)", c.Name(), err, tail(out))
	}
	m := Manifest{Case: c.CaseJSON(), Backend: c.Backend, Generator: s.Generator, Bytes: n, Sum: sum,
		Made: time.Now().UTC().Format(time.RFC3339), Seconds: time.Since(start).Seconds()}
	if v, err := exec.Command(s.Kcheck, "--version").Output(); err == nil {
		m.Kcheck = strings.TrimSpace(string(v))
	}
	if err := os.Rename(made, file); err != nil {
		return err
	}
	mb, _ := json.MarshalIndent(m, "", "  ")
	return os.WriteFile(man, mb, 0o644)
}

func tail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	return s
}
