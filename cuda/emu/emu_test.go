//go:build cudaemu

package emu_test

// The cuda-emu backend's own tests (make emu-test): the worker protocol
// with crashing and hanging kernels, and the planted kernel bugs that must
// fail. They build the emulated worker, and for each plant one kernel
// module from a planted copy of the sources; the unplanted modules are
// make emu's build/emu.

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/cuda/emu"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/cli"
	"github.com/kcheck-dev/kcheck/internal/gpu"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

var (
	root   string // the repository
	worker string // the emulated worker built for these tests
)

func TestMain(m *testing.M) {
	var err error
	if root, err = filepath.Abs(filepath.Join("..", "..")); err != nil {
		panic(err)
	}
	dir, err := os.MkdirTemp("", "kcheck-emu-test-*")
	if err != nil {
		panic(err)
	}
	worker = filepath.Join(dir, "kcheck-gpu-emu")
	cmd := exec.Command("go", "build", "-tags", "cudaemu", "-o", worker, "./cmd/kcheck-gpu")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Stderr.Write(out)
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// asan: KCHECK_EMU_TEST_ASAN=1 runs everything on the AddressSanitizer
// modules (make emu-asan; what CI builds), except the plants of
// TestPlantedBugsFail: a plant is a wrong number, not a memory error, and
// each planted module is a build of its own, which ASan's instrumentation
// makes 1.3x as costly (kvcache.cu: 16.2 s of CPU against 12.5 s, measured
// 2026-12-02) before it slows the run; the clean run each plant is compared
// with stays on the ASan modules.
var asan = os.Getenv("KCHECK_EMU_TEST_ASAN") == "1"

func modules(t *testing.T) string {
	d := filepath.Join(root, "build", "emu")
	if asan {
		d = filepath.Join(root, "build", "emu-asan")
	}
	if _, err := os.Stat(filepath.Join(d, "kvcache.emu.so")); err != nil {
		t.Fatalf("no emulated modules in %s: run `make emu` first", d)
	}
	return d
}

func backendFor(t *testing.T, dir, extra string) *gpu.Backend {
	return backendOf(t, dir, extra, asan)
}

// backendOf is the emulated backend over the modules in dir, built with
// AddressSanitizer or not.
func backendOf(t *testing.T, dir, extra string, asanBuilt bool) *gpu.Backend {
	spec := "worker=" + worker + ",dir=" + dir
	if asanBuilt {
		spec += ",asan"
	}
	if extra != "" {
		spec += "," + extra
	}
	b, err := gpu.ParseEmuBackend(spec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func catalogCase(t *testing.T, name string) cases.Case {
	all, err := cases.Catalog()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range all {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no catalog case %s", name)
	return cases.Case{}
}

// TestFaultKernels runs faults.cu's deliberately broken kernels through the
// worker protocol: each is recorded with its status and the run goes on.
func TestFaultKernels(t *testing.T) {
	dir := modules(t)
	in := kernel.Inputs{Tensors: map[string]*tensor.Tensor{"partial_out": tensor.New(tensor.F32, 1, 1, 4), "partial_lse": tensor.New(tensor.F32, 1, 1)}, Params: kernel.Params{}}
	for _, tc := range []struct {
		fault     string
		status    gpu.Status
		cudaError string
	}{
		{"oob", gpu.StatusCrash, "CUDA_ERROR_ILLEGAL_ADDRESS"},
		{"trap", gpu.StatusCrash, "CUDA_ERROR_ILLEGAL_INSTRUCTION"},
		{"hang", gpu.StatusHang, ""},
	} {
		t.Run(tc.fault, func(t *testing.T) {
			b := backendFor(t, dir, "timeout=5s")
			b.Worker.Env = append(b.Worker.Env, "KCHECK_GPU_FAULT="+tc.fault)
			_, info, err := b.Worker.Run(context.Background(), "splitk_combine", in)
			var re *gpu.RunError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want a *gpu.RunError", err)
			}
			if info.Status != tc.status || info.CUDAError != tc.cudaError {
				t.Errorf("status %s, CUDA error %q; want %s, %q (%v)", info.Status, info.CUDAError, tc.status, tc.cudaError, err)
			}
		})
	}
}

// A plant is one realistic kernel bug, applied to a copy of the sources.
type plant struct {
	name, file, old, new string
	arch                 emu.Arch
	backend              string // extra backend options
	cases                []string
}

var plants = []plant{
	{
		name: "missing cp.async wait (GEMM pipeline)", file: "nvfp4",
		old:  "        kc_cp_async_wait<STAGES - 2>();\n        __syncthreads();\n        {\n            // Refill",
		new:  "        __syncthreads();\n        {\n            // Refill",
		arch: emu.Archs[0], cases: []string{"nvfp4_gemm/down_n7168_k2048/m16"},
	},
	{
		// The slot inside the page is one off (wrapping at the page end):
		// every read stays inside the cache, so it is the numbers that fail.
		name: "off-by-one slot in the gather", file: "kvcache",
		old:  "const int64_t slot = (int64_t)blk * P + t % P;",
		new:  "const int64_t slot = (int64_t)blk * P + (t + 1) % P;",
		arch: emu.Archs[0], cases: []string{"kv_cache_gather/bf16/p16/ctx-3P", "kv_cache_gather/fp8_ds_mla/p64/ctx-P+1", "kv_cache_gather/fp8_e4m3/p64/ctx-P+1"},
	},
	{
		name: "wrong sm_120a scale row (A rows g+8 get row g's scales)", file: "nvfp4",
		old:  "sm.a_sf[st][r + (t & 1) * 8]",
		new:  "sm.a_sf[st][r + (t >> 1) * 8]",
		arch: emu.Archs[1], backend: "arch=sm_120", cases: []string{"nvfp4_gemm/gate_up_n2048_k7168/m16"},
	},
	{
		name: "missing __syncthreads before the row maxima are read (MLA decode)", file: "mla_decode",
		old:  "            sMax[wn * BM + lr1] = mx1;\n        }\n        __syncthreads();\n",
		new:  "            sMax[wn * BM + lr1] = mx1;\n        }\n",
		arch: emu.Archs[0], cases: []string{"mla_decode/deepseek-v3/tp8/bf16/p64/ctx-4P+3", "mla_decode/kimi-k2/tp1/bf16/p16/ctx-4P+3"},
	},
}

// TestPlantedBugsFail applies each plant to a copy of cuda/, builds the
// planted module, and runs the cases it must fail; the same cases on the
// unplanted modules pass, so the failure is the plant's.
func TestPlantedBugsFail(t *testing.T) {
	clean := modules(t)
	for _, p := range plants {
		t.Run(p.name, func(t *testing.T) {
			src := t.TempDir()
			for _, pat := range []string{"*.cu", "*.cuh"} {
				files, _ := filepath.Glob(filepath.Join(root, "cuda", pat))
				for _, f := range files {
					b, err := os.ReadFile(f)
					if err != nil {
						t.Fatal(err)
					}
					if filepath.Base(f) == p.file+".cu" {
						if n := strings.Count(string(b), p.old); n != 1 {
							t.Fatalf("the plant's text occurs %d times in %s, want once", n, f)
						}
						b = []byte(strings.Replace(string(b), p.old, p.new, 1))
					}
					if err := os.WriteFile(filepath.Join(src, filepath.Base(f)), b, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			out := filepath.Join(src, "emu")
			start := time.Now()
			if err := emu.Build(emu.Options{Src: src, EmuRoot: filepath.Join(root, "cuda", "emu"), Out: out,
				Files: []string{p.file}, Archs: []emu.Arch{p.arch}}); err != nil {
				t.Fatal(err)
			}
			t.Logf("planted %s%s built in %.0f s", p.file, p.arch.Suffix, time.Since(start).Seconds())
			for _, name := range p.cases {
				c := catalogCase(t, name)
				ok := cli.RunCase(context.Background(), c, backendFor(t, clean, p.backend), check.Options{}, 10*time.Minute, "", false)
				if ok.Verdict != check.Pass {
					t.Fatalf("%s on the unplanted modules: %s (%v), want pass", name, ok.Verdict, ok.Error)
				}
				bad := cli.RunCase(context.Background(), c, backendOf(t, out, p.backend, false), check.Options{}, 10*time.Minute, "", false)
				if bad.Verdict != check.Fail {
					msg := ""
					if bad.Error != nil {
						msg = *bad.Error
					}
					t.Errorf("%s with the plant: verdict %s %s, want fail", name, bad.Verdict, msg)
					continue
				}
				worst := ""
				for _, ch := range bad.Checks {
					if ch.Verdict == check.Fail {
						worst = ch.Tensor + ": " + ch.Reason
						break
					}
				}
				t.Logf("%s: FAIL as planted (%s)", name, worst)
			}
		})
	}
}
