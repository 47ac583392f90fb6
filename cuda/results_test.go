package cuda_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// The results summary of the GPU tests (cuda_test.go, bench_test.go):
// results.json and results.md in $KCHECK_GPU_RESULTS. They are rewritten
// after every catalog case and every benchmark, each file replaced whole
// (written beside it, then renamed), so a step that gpu-check.sh kills at
// its time limit still leaves the table of every case that finished. This
// file carries no build tag: the bookkeeping is tested without a GPU.

// record is one row of the results summary.
type record struct {
	Name    string  `json:"name"`
	Kernel  string  `json:"kernel"`
	Verdict string  `json:"verdict"` // pass fail inconclusive error load_failed unsupported skipped
	Reason  string  `json:"reason,omitempty"`
	MS      float64 `json:"ms,omitempty"`
	Launch  string  `json:"launch,omitempty"`
	Path    string  `json:"gemm_path,omitempty"`
}

type benchRow struct {
	Name      string  `json:"name"`
	MS        float64 `json:"kernel_ms"`
	Figure    string  `json:"figure"`
	Yardstick string  `json:"yardstick"`
	Ratio     string  `json:"ratio"`
	Target    string  `json:"target"`
}

// deviceDesc is what the summary says about the GPU.
type deviceDesc struct {
	Name, Arch  string
	Driver, SMs int
}

// resultStore is the summary being built: the rows so far and where they go.
type resultStore struct {
	sync.Mutex
	rows  []record
	bench []benchRow
	// dir is $KCHECK_GPU_RESULTS ("": no files); dev and start are set
	// by TestMain before any test runs.
	dir   string
	dev   deviceDesc
	start time.Time
	// err is the first failed write; TestMain fails the run with it.
	err error
}

// results is the store of this test binary's run.
var results resultStore

func addRecord(r record)  { results.addRecord(r) }
func addBench(r benchRow) { results.addBench(r) }

func (s *resultStore) addRecord(r record) {
	s.Lock()
	defer s.Unlock()
	s.rows = append(s.rows, r)
	s.saveLocked()
}

func (s *resultStore) addBench(r benchRow) {
	s.Lock()
	defer s.Unlock()
	s.bench = append(s.bench, r)
	s.saveLocked()
}

// save writes the summary of everything recorded so far and returns the
// first write error of the run.
func (s *resultStore) save() error {
	s.Lock()
	defer s.Unlock()
	s.saveLocked()
	return s.err
}

func (s *resultStore) saveLocked() {
	if s.dir == "" {
		return
	}
	rows := append([]record(nil), s.rows...)
	sort.Slice(rows, func(i, j int) bool { return rows[i].Name < rows[j].Name })
	if err := writeSummary(s.dir, s.dev, time.Since(s.start), rows, s.bench); err != nil && s.err == nil {
		s.err = err
	}
}

// writeFileWhole replaces path by data, never leaving a partial file.
func writeFileWhole(path string, data []byte) error {
	tmp := path + ".partial"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func writeSummary(dir string, dev deviceDesc, elapsed time.Duration, rows []record, bench []benchRow) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	counts := map[string]int{}
	perKernel := map[string]map[string]int{}
	for _, r := range rows {
		counts[r.Verdict]++
		if perKernel[r.Kernel] == nil {
			perKernel[r.Kernel] = map[string]int{}
		}
		perKernel[r.Kernel][r.Verdict]++
	}
	doc := map[string]any{
		"device": dev.Name, "arch": dev.Arch, "driver": dev.Driver, "sms": dev.SMs,
		"elapsed_s": elapsed.Seconds(), "counts": counts, "per_kernel": perKernel,
		"cases": rows, "bench": bench,
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileWhole(filepath.Join(dir, "results.json"), append(b, '\n')); err != nil {
		return err
	}
	var md strings.Builder
	fmt.Fprintf(&md, "# kcheck CUDA kernels on %s (%s, driver %d)\n\n", dev.Name, dev.Arch, dev.Driver)
	fmt.Fprintf(&md, "%d catalog cases in %.1f s: ", len(rows), elapsed.Seconds())
	var vs []string
	for v := range counts {
		vs = append(vs, v)
	}
	sort.Strings(vs)
	for i, v := range vs {
		if i > 0 {
			md.WriteString(", ")
		}
		fmt.Fprintf(&md, "%d %s", counts[v], v)
	}
	md.WriteString("\n\n| kernel | pass | fail | inconclusive | error | load_failed | unsupported | skipped |\n|---|---|---|---|---|---|---|---|\n")
	var ks []string
	for k := range perKernel {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	for _, k := range ks {
		c := perKernel[k]
		fmt.Fprintf(&md, "| %s | %d | %d | %d | %d | %d | %d | %d |\n", k, c["pass"], c["fail"], c["inconclusive"], c["error"], c["load_failed"], c["unsupported"], c["skipped"])
	}
	md.WriteString("\n## Cases that did not pass\n\n")
	n := 0
	for _, r := range rows {
		if r.Verdict == "pass" || r.Verdict == "skipped" {
			continue
		}
		n++
		fmt.Fprintf(&md, "- `%s` **%s**: %s\n", r.Name, r.Verdict, strings.ReplaceAll(r.Reason, "|", "\\|"))
	}
	if n == 0 {
		md.WriteString("(none)\n")
	}
	if len(bench) > 0 {
		md.WriteString("\n## Benchmarks\n\n| benchmark | kernel ms | figure | yardstick | ratio | target |\n|---|---|---|---|---|---|\n")
		for _, b := range bench {
			fmt.Fprintf(&md, "| %s | %.4g | %s | %s | %s | %s |\n", b.Name, b.MS, b.Figure, b.Yardstick, b.Ratio, b.Target)
		}
	}
	return writeFileWhole(filepath.Join(dir, "results.md"), []byte(md.String()))
}

// TestResultsWrittenAsTheyCome: after every case the files hold every row
// so far, whole, so a catalog step killed at its time limit keeps them.
func TestResultsWrittenAsTheyCome(t *testing.T) {
	s := &resultStore{dir: t.TempDir(), dev: deviceDesc{Name: "test GPU", Arch: "sm_120"}, start: time.Now()}
	rows := []record{
		{Name: "nvfp4_gemm/b", Kernel: "nvfp4_gemm", Verdict: "pass"},
		{Name: "mla_decode/a", Kernel: "mla_decode", Verdict: "fail", Reason: "out fail: 3 elements | over"},
		{Name: "kv_cache_write/c", Kernel: "kv_cache_write", Verdict: "pass"},
	}
	for i, r := range rows {
		s.addRecord(r)
		b, err := os.ReadFile(filepath.Join(s.dir, "results.json"))
		if err != nil {
			t.Fatalf("after case %d: %v", i+1, err)
		}
		var doc struct {
			Cases  []record       `json:"cases"`
			Counts map[string]int `json:"counts"`
			Device string         `json:"device"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("after case %d: results.json is not whole JSON: %v", i+1, err)
		}
		if len(doc.Cases) != i+1 || doc.Device != "test GPU" {
			t.Fatalf("after case %d: results.json has %d cases on %q", i+1, len(doc.Cases), doc.Device)
		}
		md, err := os.ReadFile(filepath.Join(s.dir, "results.md"))
		if err != nil || !strings.Contains(string(md), fmt.Sprintf("%d catalog cases", i+1)) {
			t.Fatalf("after case %d: results.md %q, %v", i+1, md, err)
		}
	}
	s.addBench(benchRow{Name: "nvfp4_dequantize", MS: 0.5, Ratio: "0.9"})
	md, _ := os.ReadFile(filepath.Join(s.dir, "results.md"))
	if !strings.Contains(string(md), "`mla_decode/a` **fail**: out fail: 3 elements \\| over") || !strings.Contains(string(md), "| nvfp4_dequantize | 0.5 |") {
		t.Errorf("results.md lacks the failing case or the benchmark:\n%s", md)
	}
	if left, _ := filepath.Glob(filepath.Join(s.dir, "*.partial")); len(left) != 0 {
		t.Errorf("partial files left: %v", left)
	}
	if err := s.save(); err != nil {
		t.Errorf("save: %v", err)
	}
}

// A write that fails is kept for TestMain to fail the run with.
func TestResultsWriteError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s := &resultStore{dir: filepath.Join(file, "results")}
	s.addRecord(record{Name: "x", Verdict: "pass"})
	if err := s.save(); err == nil {
		t.Error("no error for a results directory under a file")
	}
}
