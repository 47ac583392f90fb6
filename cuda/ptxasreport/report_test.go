package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The testdata logs are real ptxas -v output: ptxas 11.8 and 13.0 on
// small.ptx (a kernel with 4 KB of __shared__ and one without), ptxas 13.0
// on a kernel built to spill (nvcc -maxrregcount=16), and ptxas 13.0 on two
// MLA decode variants of mla_decode.cu for sm_120. small.ptx is hand-written
// input (ptxas 13.0's report on it checked against ptxas-13.0.log in CI);
// mla.ptx and mla-sm_120.log are generated from cuda/mla_decode.cu
// (testdata/excerpt.sh, mlalog.sh; checked in CI by make
// ptxasreport-testdata-check).
func TestParsePtxas(t *testing.T) {
	cases := []struct {
		file string
		want []Usage
	}{
		{"ptxas-11.8.log", []Usage{
			{Kernel: "plain_kernel", Arch: "sm_80", Registers: 8},
			{Kernel: "smem_kernel", Arch: "sm_80", Registers: 8, StaticSmem: 4096},
		}},
		{"ptxas-13.0.log", []Usage{
			{Kernel: "plain_kernel", Arch: "sm_120a", Registers: 8},
			{Kernel: "smem_kernel", Arch: "sm_120a", Registers: 10, StaticSmem: 4096},
		}},
		{"spill-13.0.log", []Usage{
			{Kernel: "spilly", Arch: "sm_90a", Registers: 24, Stack: 224, SpillStores: 468, SpillLoads: 488},
		}},
		{"mla-sm_120.log", []Usage{
			{Kernel: "mla_decode_bf16_m4_s2", Arch: "sm_120", Registers: 126},
			{Kernel: "mla_decode_bf16_m1_s2", Arch: "sm_120", Registers: 143},
		}},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", c.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got, err := ParsePtxas(f)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(c.want, got); d != "" {
				t.Errorf("usages (-want +got):\n%s", d)
			}
		})
	}
}

// A log this tool does not understand is an error, never an empty pass.
func TestParsePtxasRejects(t *testing.T) {
	cases := []struct{ name, log, want string }{
		{"twice", "ptxas info    : Compiling entry function 'k' for 'sm_90a'\nptxas info    : Used 8 registers\n" +
			"ptxas info    : Compiling entry function 'k' for 'sm_90a'\nptxas info    : Used 8 registers\n", "reported twice"},
		{"orphan used", "ptxas info    : Used 8 registers\n", "follows no"},
		{"no used", "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n", "no \"Used N registers\""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParsePtxas(strings.NewReader(c.log))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v, want one mentioning %q", err, c.want)
			}
		})
	}
}

func TestReadPTX(t *testing.T) {
	f, err := ReadPTX("testdata")
	if err != nil {
		t.Fatal(err)
	}
	wantThreads := map[string]int{"smem_kernel": 256, "mla_decode_bf16_m4_s2": 512}
	if d := cmp.Diff(wantThreads, f.Threads); d != "" {
		t.Errorf("threads (-want +got):\n%s", d)
	}
	if f.DynamicSmem["mla_decode_bf16_m1_s2"] != 95488 || f.DynamicSmem["mla_decode_sparse_bf16_m4_s3"] != 194432 || len(f.DynamicSmem) != 6 {
		t.Errorf("dynamic shared memory %v: want the six bf16 variants of mla.ptx", f.DynamicSmem)
	}
}

func TestJudge(t *testing.T) {
	budgets, err := ReadBudgets("testdata/src")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(Budgets{"_m1_s2": 101376, "_m4_s2": 166912, "_m4_s3": 232448}, budgets); d != "" {
		t.Fatalf("budgets (-want +got):\n%s", d)
	}
	ptx := PTXFacts{
		Threads:     map[string]int{"mla_decode_bf16_m1_s2": 128, "mla_decode_bf16_m4_s2": 512, "k": 1024},
		DynamicSmem: map[string]int{"mla_decode_bf16_m1_s2": 95488, "mla_decode_bf16_m4_s2": 156928},
	}
	cases := []struct {
		name     string
		u        Usage
		fits     bool
		problems string // "" when the row passes
	}{
		{"m1 fits sm_120", Usage{Kernel: "mla_decode_bf16_m1_s2", Arch: "sm_120a", Registers: 143}, true, ""},
		// 156928 bytes > 99 KB: by design, the launcher picks m1 there.
		{"m4 on sm_120 is optional", Usage{Kernel: "mla_decode_bf16_m4_s2", Arch: "sm_120a", Registers: 126}, false, ""},
		{"m4 fits sm_90a", Usage{Kernel: "mla_decode_bf16_m4_s2", Arch: "sm_90a", Registers: 126}, true, ""},
		// m1 is required everywhere: 6 KB more static memory breaks sm_120.
		{"m1 too big", Usage{Kernel: "mla_decode_bf16_m1_s2", Arch: "sm_120a", Registers: 143, StaticSmem: 6 << 10}, false, "needs 101632 bytes of shared memory, sm_120a allows 101376"},
		{"spill", Usage{Kernel: "spilly", Arch: "sm_90a", Registers: 24, SpillStores: 468, SpillLoads: 488}, true, "spills 468 bytes stored, 488 loaded"},
		{"registers", Usage{Kernel: "k", Arch: "sm_100a", Registers: 72}, false, "72 registers x 1024 threads exceed the 65536"},
		{"64 regs x 1024 is the limit", Usage{Kernel: "k", Arch: "sm_100a", Registers: 64}, true, ""},
		{"unknown arch", Usage{Kernel: "k", Arch: "sm_70", Registers: 8}, false, "no known limits for sm_70"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rows := Judge([]Usage{c.u}, ptx, budgets)
			if len(rows) != 1 {
				t.Fatalf("%d rows", len(rows))
			}
			r := rows[0]
			if r.Fits != c.fits {
				t.Errorf("fits = %v, want %v (row %+v)", r.Fits, c.fits, r)
			}
			got := strings.Join(r.Problems, "; ")
			if (c.problems == "") != (got == "") || !strings.Contains(got, c.problems) {
				t.Errorf("problems %q, want %q", got, c.problems)
			}
		})
	}
}

// TestRun runs the command over real logs: exit 0 and a table when all
// fits, exit 1 naming the row when a kernel spills, exit 2 on a log with
// no kernels.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	cases := []struct {
		name, log string
		code      int
		out       string
	}{
		{"fits", read("ptxas-13.0.log") + read("mla-sm_120.log"), 0, "no spills, every kernel fits"},
		{"spill", read("ptxas-13.0.log") + read("spill-13.0.log"), 1, "| sm_90a | spilly | 24 | - | 224 | 468/488 |"},
		{"empty", "nothing here\n", 2, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run([]string{"-log", write(c.name+".log", c.log), "-ptx", "testdata", "-src", "testdata/src"}, &out, &errb)
			if code != c.code {
				t.Fatalf("exit %d, want %d; stdout:\n%s\nstderr: %s", code, c.code, out.String(), errb.String())
			}
			if !strings.Contains(out.String(), c.out) {
				t.Errorf("stdout lacks %q:\n%s", c.out, out.String())
			}
			if c.code == 1 && !strings.Contains(out.String(), "**FAIL**: spills") {
				t.Errorf("the failing row is not marked:\n%s", out.String())
			}
		})
	}
}
