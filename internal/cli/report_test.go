package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --report on check writes the report beside the usual output and keeps the
// exit status; it refuses, before checking anything, to overwrite a report
// without --force; `kcheck report` re-renders the saved JSON.
func TestCheckReportFlag(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "rep")
	bad := fx + "examples/nvfp4_dequant_nibble_order.safetensors"
	code, out, errs := run(t, "check", "--report", dir, bad)
	if code != ExitFail {
		t.Fatalf("exit %d, want 1\n%s\n%s", code, out, errs)
	}
	if !strings.Contains(out, "FAIL") || !strings.Contains(errs, "report written to "+filepath.Join(dir, "report.md")) {
		t.Errorf("stdout %q\nstderr %q", out, errs)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kcheck check " + bad, "### Evidence files", "![Figure 1, 1-out-along.png](plots/1-out-along.png)"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
	// Again without --force: refused up front (exit 2), nothing checked.
	code, out, errs = run(t, "check", "--report", dir, bad)
	if code != ExitUsage || out != "" || !strings.Contains(errs, "exists: not overwriting it (use --force)") {
		t.Errorf("second run: exit %d\nstdout %q\nstderr %q", code, out, errs)
	}
	if code, _, errs = run(t, "check", "--report", dir, "--force", bad); code != ExitFail {
		t.Errorf("--force: exit %d: %s", code, errs)
	}
	// Re-render: Markdown on stdout, or a directory with --out.
	code, out, errs = run(t, "report", filepath.Join(dir, "report.json"))
	if code != ExitPass || !strings.Contains(out, "## kcheck: FAIL: nvfp4_dequantize") {
		t.Errorf("report to stdout: exit %d\n%.200s\n%s", code, out, errs)
	}
	dir2 := filepath.Join(t.TempDir(), "again")
	if code, _, errs = run(t, "report", "--out", dir2, filepath.Join(dir, "report.json")); code != ExitPass {
		t.Fatalf("report --out: exit %d: %s", code, errs)
	}
	again, _ := os.ReadFile(filepath.Join(dir2, "report.md"))
	if string(again) != string(md) {
		t.Error("re-rendered report.md differs from the one --report wrote")
	}
	if code, _, errs = run(t, "report", filepath.Join(t.TempDir(), "missing.json")); code != ExitUsage {
		t.Errorf("missing input: exit %d: %s", code, errs)
	}
}

// --report on run: every case is an item with its reproduction command;
// with --out the captures are the evidence. No progress bar is drawn into
// a non-terminal stderr.
func TestRunReportFlag(t *testing.T) {
	tmp := t.TempDir()
	dir, caps := filepath.Join(tmp, "rep"), filepath.Join(tmp, "caps")
	name := "kv_cache_gather/bf16/p16/ctx-3P"
	if err := os.MkdirAll(caps, 0o755); err != nil { // --out does not create its directory
		t.Fatal(err)
	}
	code, _, errs := run(t, "run", "--case", name, "--backend", "faulty:page_boundary_off_by_one", "--out", caps, "--report", dir)
	if code != ExitFail {
		t.Fatalf("exit %d: %s", code, errs)
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"kcheck run --case " + name + " --backend faulty:page_boundary_off_by_one",
		captureFile(caps, name),
		"`page_boundary` (by `page_offset`)", // the page off-by-one: its offset-0 tokens, not "by token"
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
	if strings.ContainsAny(errs, "\r\x1b") {
		t.Errorf("progress bar drawn into a non-terminal stderr: %q", errs)
	}
}

// --report on an output full of NaN (the shipped example
// mla_decode_page_tail, and the fault that makes it) writes the report with
// its plots, in check, run and diagnose; it used to panic and write nothing.
func TestReportOfNaNOutputs(t *testing.T) {
	tail := fx + "examples/mla_decode_page_tail.safetensors"
	tests := []struct {
		name string
		args func(t *testing.T, dir string) []string
	}{
		{"check", func(_ *testing.T, dir string) []string { return []string{"check", "--report", dir, tail} }},
		{"diagnose", func(_ *testing.T, dir string) []string { return []string{"diagnose", "--report", dir, tail} }},
		{"run", func(t *testing.T, dir string) []string {
			cases := writeFile(t, filepath.Join(t.TempDir(), "c.json"),
				[]byte(`{"cases":[{"name":"tail","kernel":"mla_decode","heads":2,"seq_lens":[20,33],"page_size":16,"splits":2}]}`))
			return []string{"run", "--cases", cases, "--backend", "faulty:page_tail_attended", "--report", dir}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // drawing PNGs is slow under the race detector
			dir := filepath.Join(t.TempDir(), "rep")
			code, out, errs := run(t, tc.args(t, dir)...)
			if code != ExitFail {
				t.Fatalf("exit %d, want 1\nstdout %.500s\nstderr %.2000s", code, out, errs)
			}
			md, err := os.ReadFile(filepath.Join(dir, "report.md"))
			if err != nil {
				t.Fatalf("no report: %v\nstderr %.2000s", err, errs)
			}
			pngs, _ := filepath.Glob(filepath.Join(dir, "plots", "*.png"))
			if len(pngs) == 0 || strings.Contains(string(md), "could not be drawn") {
				t.Errorf("%d plots; report.md:\n%s", len(pngs), md)
			}
		})
	}
}

// Problems of the --report directory stop check, run and diagnose before
// anything is checked (nothing on stdout), and leave what a link in it
// points at alone.
func TestReportDirCheckedFirst(t *testing.T) {
	file := fx + "golden/nvfp4_gemm.safetensors"
	cases := writeFile(t, filepath.Join(t.TempDir(), "c.json"), []byte(`{"cases":[{"name":"small","kernel":"nvfp4_quantize","m":2,"k":32}]}`))
	for _, args := range [][]string{
		{"check", file},
		{"run", "--cases", cases},
		{"diagnose", fx + "examples/pipeline_ok.safetensors"},
		{"diagnose", "--simulate", "--steps", "2"},
	} {
		t.Run(args[0]+" plots linked out", func(t *testing.T) {
			rep, outside := filepath.Join(t.TempDir(), "rep"), t.TempDir()
			victim := writeFile(t, filepath.Join(outside, "1-out-along.png"), []byte("precious"))
			os.MkdirAll(rep, 0o755)
			if err := os.Symlink(outside, filepath.Join(rep, "plots")); err != nil {
				t.Fatal(err)
			}
			code, out, errs := run(t, append(args, "--report", rep, "--force")...)
			if code != ExitUsage || out != "" || !strings.Contains(errs, "symbolic link") {
				t.Errorf("exit %d\nstdout %.300q\nstderr %q", code, out, errs)
			}
			if b, _ := os.ReadFile(victim); string(b) != "precious" {
				t.Errorf("the linked file now holds %.20q", b)
			}
		})
		t.Run(args[0]+" a file", func(t *testing.T) {
			rep := writeFile(t, filepath.Join(t.TempDir(), "rep"), []byte("precious"))
			code, out, errs := run(t, append(args, "--report", rep)...)
			if code != ExitUsage || out != "" || !strings.Contains(errs, "not a directory") {
				t.Errorf("exit %d\nstdout %.300q\nstderr %q", code, out, errs)
			}
		})
	}
}
