package check

import (
	"context"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"testing"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// capture builds a case's inputs and stores outs as the kernel's outputs.
func captureOf(t *testing.T, c cases.Case, outs map[string]*tensor.Tensor) evidence.Capture {
	t.Helper()
	in, err := c.Inputs()
	if err != nil {
		t.Fatal(err)
	}
	meta, err := c.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	ts := map[string]*tensor.Tensor{}
	for k, v := range in.Tensors {
		ts[k] = v
	}
	for k, v := range outs {
		ts[k] = v
	}
	return evidence.Capture{Name: c.Name, Metadata: meta, Tensors: ts}
}

// produce runs the reference of c's kernel at precision prec, with
// params overriding the case's own (what another correct kernel declares).
func produce(t *testing.T, c cases.Case, prec kernel.Precision, params map[string]string) map[string]*tensor.Tensor {
	t.Helper()
	in, err := c.Inputs()
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range params {
		in.Params[k] = v
	}
	k, err := kernel.Lookup(c.Kernel)
	if err != nil {
		t.Fatal(err)
	}
	out, err := kernel.Produce(context.Background(), k, in, prec, nil)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func with(p kernel.Precision, f func(*kernel.Precision)) kernel.Precision {
	f(&p)
	return p
}

// The three-way verdict's two promises, on the real references at a few
// thousand tokens: kernels that are correct but round differently pass,
// and a real precision fault (bf16 accumulation of PV) fails.
func TestThreeWayOnAttention(t *testing.T) {
	if testing.Short() {
		t.Skip("4096-token decode")
	}
	decode := cases.Case{Name: "decode-4k", Kernel: "mla_decode", Preset: "kimi-k2", TP: 8, SeqLens: []int{4096, 3001},
		PageSize: 64, KVCacheDType: "bf16", Seed: 7}
	def := kernel.DefaultPrecision()

	// A split-K kernel: 8 splits, its partials merged by the combine.
	splitOut := func() map[string]*tensor.Tensor {
		parts := produce(t, decode, def, map[string]string{"num_splits": "8"})
		comb, _ := kernel.Lookup("splitk_combine")
		po, pl := parts["partial_out"], parts["partial_lse"]
		n := po.Shape[0] * po.Shape[1] * po.Shape[2]
		merged, err := kernel.Produce(context.Background(), comb, kernel.Inputs{Params: kernel.Params{}, Tensors: map[string]*tensor.Tensor{
			"partial_out": {DType: po.DType, Shape: []int{n, 8, po.Shape[4]}, Data: po.Data},
			"partial_lse": {DType: pl.DType, Shape: []int{n, 8}, Data: pl.Data},
		}}, def, map[string]tensor.DType{"out": tensor.BF16})
		if err != nil {
			t.Fatal(err)
		}
		out := merged["out"]
		return map[string]*tensor.Tensor{"out": {DType: out.DType, Shape: parts["out"].Shape, Data: out.Data}}
	}

	tests := []struct {
		name string
		outs map[string]*tensor.Tensor
		want compare.Verdict
	}{
		{"declared precision", produce(t, decode, def, nil), Pass},
		{"P kept in fp32", produce(t, decode, with(def, func(p *kernel.Precision) { p.P = tensor.F32 }), nil), Pass},
		{"P rounded to fp16", produce(t, decode, with(def, func(p *kernel.Precision) { p.P = tensor.F16 }), nil), Pass},
		{"fp64 accumulation", produce(t, decode, with(def, func(p *kernel.Precision) { p.Acc = tensor.F64 }), nil), Pass},
		{"8 splits and a combine", splitOut(), Pass},
		{"bf16 accumulation", produce(t, decode, with(def, func(p *kernel.Precision) { p.Acc = tensor.BF16 }), nil), Fail},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			outs := map[string]*tensor.Tensor{"out": tc.outs["out"]}
			res := Run(t.Context(), captureOf(t, decode, outs), Options{})
			if res.Verdict != tc.want {
				t.Fatalf("verdict %s, want %s (%s: worst err/tol %.3g, rmse ratio %.3g)", res.Verdict, tc.want,
					res.Checks[0].Reason, float64(res.Checks[0].Metrics.MaxExcess), float64(res.Checks[0].Metrics.RMSERatio))
			}
			t.Logf("%s: worst err/tol %.3g, rmse/bound %.3g", tc.name, float64(res.Checks[0].Metrics.MaxExcess), float64(res.Checks[0].Metrics.RMSERatio))
		})
	}
}

// NVFP4 codes that differ from the expected ones only at rounding ties
// (the exact-division quantizer against the fp32 one) are not faults, and
// an FP8 writer that saturates where the capture declares a
// non-saturating one is correct when nothing overflows.
func TestThreeWayOnCodes(t *testing.T) {
	quant := cases.Case{Name: "q", Kernel: "nvfp4_quantize", M: 256, K: 7168, Seed: 3,
		Params: map[string]string{"scale_layout": "swizzled_128x4"}}
	in, err := quant.Inputs()
	if err != nil {
		t.Fatal(err)
	}
	k, _ := kernel.Lookup("nvfp4_quantize")
	refs, err := kernel.Evaluate(context.Background(), k, in, kernel.DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	outs := map[string]*tensor.Tensor{}
	differ := 0
	for _, o := range refs {
		outs[o.Name] = kernel.Materialize(o.DType, o.Shape, o.Exact)
		for i := 0; i < o.Exact.Len(); i++ {
			if o.Exact.At(i) != o.Expected.At(i) {
				differ++
			}
		}
	}
	if differ == 0 {
		t.Fatalf("exact and fp32 quantizers agree everywhere: the test would prove nothing")
	}
	if res := Run(t.Context(), captureOf(t, quant, outs), Options{}); res.Verdict != Pass {
		t.Fatalf("exact-division codes (%d differ from fp32) verdict %s, want pass", differ, res.Verdict)
	}

	write := cases.Case{Name: "w", Kernel: "kv_cache_write", Preset: "deepseek-v3", SeqLens: []int{40, 17}, PageSize: 16,
		KVCacheDType: "fp8_e4m3", Seed: 5, Params: map[string]string{"fp8_saturate": "false"}}
	sat := produce(t, write, kernel.DefaultPrecision(), nil)
	if res := Run(t.Context(), captureOf(t, write, sat), Options{}); res.Verdict != Pass {
		t.Fatalf("saturating writer under declared non-saturating: verdict %s, want pass", res.Verdict)
	}
}

// The two captures of issue 11 item 2, F32 outputs bit-identical to the
// declared-precision reference that failed on cos_diff (1.5e-13, 6x its
// bound, for the first): an nvfp4_dequantize with a ModelOpt-style global
// scale (global_scale_kind left at dequant) and a kv_cache_gather from an
// fp8_e4m3 cache. A bit-exact output has the floor's cos_diff, so it
// passes, and so does the same output through the checker's whole path.
func TestDeclaredPrecisionF32OutputsPass(t *testing.T) {
	for _, tc := range []struct {
		c   cases.Case
		out string
	}{
		{cases.Case{Name: "nvfp4_dequantize F32, ModelOpt global", Kernel: "nvfp4_dequantize", M: 64, K: 2048, Seed: 1}, "out"},
		{cases.Case{Name: "kv_cache_gather F32 from fp8_e4m3", Kernel: "kv_cache_gather", KVCacheDType: "fp8_e4m3", PageSize: 16,
			SeqLens: []int{48, 33}, Seed: 5}, "gathered"},
	} {
		t.Run(tc.c.Name, func(t *testing.T) {
			in, err := tc.c.Inputs()
			if err != nil {
				t.Fatal(err)
			}
			k, _ := kernel.Lookup(tc.c.Kernel)
			outs, err := kernel.Produce(context.Background(), k, in, kernel.DefaultPrecision(), map[string]tensor.DType{tc.out: tensor.F32})
			if err != nil {
				t.Fatal(err)
			}
			res := Run(t.Context(), captureOf(t, tc.c, outs), Options{})
			if res.Verdict != Pass || len(res.Checks) != 1 {
				t.Fatalf("verdict %s (%v), want pass", res.Verdict, reasons(res))
			}
			m := res.Checks[0].Metrics
			if m.MaxULP != 0 || m.CosDiff != m.FloorCosDiff || m.CosDiffRatio > 1 || m.RMSERatio > 1 {
				t.Errorf("max ulp %v, cos_diff %v (floor %v, %.3g of its bound), rmse %.3g of its bound; want 0 ulp, the floor's cos_diff, within the bounds",
					m.MaxULP, m.CosDiff, m.FloorCosDiff, float64(m.CosDiffRatio), float64(m.RMSERatio))
			}
		})
	}
}

func reasons(r Result) []string {
	var s []string
	if r.Error != nil {
		s = append(s, *r.Error)
	}
	for _, c := range r.Checks {
		s = append(s, c.Tensor+": "+string(c.Verdict)+": "+c.Reason)
	}
	return s
}
