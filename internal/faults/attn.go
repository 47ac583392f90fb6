package faults

import (
	"context"
	"fmt"
	"math"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Attention faults (stage attn): the MLA decode kernels.

var decodeKernels = []string{"mla_decode", "mla_decode_sparse"}

// flashMLADefaultScale is FlashMLA's softmax_scale when none is passed,
// q.shape[-1]^-0.5 over the absorbed D = 576: right for a plain 576-wide
// head, wrong for DeepSeek's (192^-0.5 times the yarn mscale^2).
var flashMLADefaultScale = math.Pow(576, -0.5)

// mlaCase is a quick decode case at DeepSeek-V3's real L and R, TP32 (4
// heads), two requests whose contexts end mid-page.
func mlaCase(sq int) cases.Case {
	return cases.Case{Name: "trigger/mla_decode", Kernel: "mla_decode", Preset: "deepseek-v3", TP: 32, SQ: sq,
		SeqLens: []int{37, 20}, PageSize: 16, KVCacheDType: "bf16", Splits: 4, Seed: 103}
}

// axisView locates index i of axis ax in a row-major tensor: the tensor is
// outer x n x inner elements with n = shape[ax].
func axisView(shape []int, ax int) (outer, n, inner int) {
	outer, inner = 1, 1
	for d, s := range shape {
		switch {
		case d < ax:
			outer *= s
		case d > ax:
			inner *= s
		}
	}
	return outer, shape[ax], inner
}

// takeAxis returns index i of axis ax of t, keeping the axis (size 1).
func takeAxis(t *tensor.Tensor, ax, i int) *tensor.Tensor {
	outer, n, inner := axisView(t.Shape, ax)
	shape := append([]int(nil), t.Shape...)
	shape[ax] = 1
	r := tensor.New(t.DType, shape...)
	es := t.DType.Size() * inner
	for o := 0; o < outer; o++ {
		copy(r.Data[o*es:(o+1)*es], t.Data[(o*n+i)*es:(o*n+i+1)*es])
	}
	return r
}

// putAxis stores src (axis ax of size 1) at index i of axis ax of dst.
func putAxis(dst *tensor.Tensor, ax, i int, src *tensor.Tensor) {
	outer, n, inner := axisView(dst.Shape, ax)
	es := dst.DType.Size() * inner
	for o := 0; o < outer; o++ {
		copy(dst.Data[(o*n+i)*es:(o*n+i+1)*es], src.Data[o*es:(o+1)*es])
	}
}

// swapAxis exchanges indices a and b of axis ax in place.
func swapAxis(t *tensor.Tensor, ax, a, b int) {
	ta, tb := takeAxis(t, ax, a), takeAxis(t, ax, b)
	putAxis(t, ax, a, tb)
	putAxis(t, ax, b, ta)
}

// headAxis is the head axis of each decode output.
var headAxis = map[string]int{"out": 2, "lse": 1, "partial_out": 2, "partial_lse": 2}

func init() {
	Register(&Fault{
		Name: "softmax_scale_default", Stage: kernel.StageAttn, Kernels: decodeKernels,
		Needs:    "a request that attends at least one token",
		BugClass: "softmax scale left at FlashMLA's default 576^-0.5 instead of the model's qk_head_dim^-0.5·mscale^2 (0.1352 for DeepSeek-V3)",
		Doc:      "The kernel ignores the softmax_scale it is given and uses 1/sqrt(576) = 0.0417, flattening every attention distribution.",
		Params: func(p kernel.Params) kernel.Params {
			p["softmax_scale"] = fmt.Sprint(flashMLADefaultScale)
			return p
		},
		Trigger: &Trigger{Case: mlaCase(1)},
	})
	Register(&Fault{
		Name: "rope_dropped", Stage: kernel.StageAttn, Kernels: decodeKernels,
		Needs:    "a request that attends at least one token",
		BugClass: "decoupled rope part dropped from the scores: q·k over the L latent columns only (a kernel sized for L, a cache view without k_pe)",
		Doc:      "Scores are computed from q_nope·kv_c alone, without q_pe·k_pe: the attention loses all position information.",
		Inputs: func(in map[string]*tensor.Tensor, p kernel.Params) (map[string]*tensor.Tensor, error) {
			q, ok := in["q"]
			if !ok || len(q.Shape) == 0 {
				return in, nil
			}
			l, err := latentDim(q, p)
			if err != nil {
				return nil, err
			}
			d := q.Shape[len(q.Shape)-1]
			c := replaced(q)
			for i := 0; i < c.Len(); i++ {
				if i%d >= l {
					c.SetFloat64(i, 0)
				}
			}
			in["q"] = c
			return in, nil
		},
		Trigger: &Trigger{Case: mlaCase(1)},
	})
	Register(&Fault{
		Name: "page_tail_attended", Stage: kernel.StageAttn, Kernels: []string{"mla_decode"},
		Needs:    "a context that ends inside a page (seq_len not a multiple of page_size, page_size > 1)",
		BugClass: "partially filled last page attended to its end: the loop bound rounded up to whole pages instead of masking at seq_len",
		Doc: "Each request attends ceil(seq_len/P)·P tokens: the unwritten tail of its last page (poison, zeros, or an earlier " +
			"sequence's tokens) joins the softmax. Contexts that end on a page boundary are unaffected.",
		Inputs: func(in map[string]*tensor.Tensor, p kernel.Params) (map[string]*tensor.Tensor, error) {
			sl, bt := in["seq_lens"], in["block_table"]
			if sl == nil || bt == nil || len(bt.Shape) != 2 {
				return in, nil
			}
			_, page, _, err := cacheGeometry(in["kv_cache"], p, "kv_cache")
			if err != nil {
				return nil, err
			}
			lens := ints(sl)
			for b, n := range lens {
				lens[b] = min((n+int64(page)-1)/int64(page)*int64(page), int64(bt.Shape[1]*page))
			}
			in["seq_lens"] = tensor.FromInt64s(sl.DType, sl.Shape, lens)
			if sb, ok := in["split_bounds"]; ok && len(sb.Shape) == 2 {
				bounds := ints(sb)
				s1 := sb.Shape[1]
				for b := range lens {
					bounds[b*s1+s1-1] = lens[b]
				}
				in["split_bounds"] = tensor.FromInt64s(sb.DType, sb.Shape, bounds)
			}
			return in, nil
		},
		Trigger: &Trigger{Case: mlaCase(1)},
	})
	Register(&Fault{
		Name: "causal_mask_top_left", Stage: kernel.StageAttn, Kernels: []string{"mla_decode"},
		Needs:    "s_q > 1 (causal = true) with a context longer than s_q",
		BugClass: "causal mask aligned top-left (FlashAttention before 2.1) instead of bottom-right for s_q > 1 (MTP, speculative decoding)",
		Doc: "Query i of s_q sees tokens 0..i instead of the first seq_len - s_q + 1 + i: with a long context every speculative " +
			"query attends only the first few tokens. Decode with s_q = 1 is unaffected.",
		Outputs: topLeftOutputs,
		Trigger: &Trigger{Case: mlaCase(2)}, Simulate: map[string]string{"s-q": "2"},
	})
	Register(&Fault{
		Name: "bf16_accumulation", Stage: kernel.StageAttn, Kernels: decodeKernels,
		Needs:    "a request that attends at least one token",
		BugClass: "reductions accumulated in bf16 instead of fp32 (an MMA accumulator or a PV sum declared bf16)",
		Doc:      "The QK^T and PV reductions round to bf16 after every step: relative errors of ~1e-2 that grow with the context.",
		Precision: func(p kernel.Precision) kernel.Precision {
			p.Acc = tensor.BF16
			return p
		},
		Trigger: &Trigger{Case: mlaCase(1)},
	})
	Register(&Fault{
		Name: "heads_swapped", Stage: kernel.StageAttn, Kernels: decodeKernels,
		Needs:    "at least two heads and a request that attends at least one token",
		BugClass: "head index slip in the output addressing: two heads' outputs exchanged (a head-group tiling that writes head pairs crossed)",
		Doc:      "Heads 0 and 1 write each other's outputs (out, lse and split-K partials): every value is plausible, two heads are wrong.",
		Outputs: func(_ context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
			for name, ax := range headAxis {
				t, ok := out[name]
				if !ok || len(t.Shape) <= ax || t.Shape[ax] < 2 {
					continue
				}
				t = replaced(t)
				swapAxis(t, ax, 0, 1)
				out[name] = t
			}
			return nil
		},
		Trigger: &Trigger{Case: mlaCase(1)},
	})
}

// topLeftOutputs recomputes a causal multi-query decode with the top-left
// mask: query i sees tokens [0, i+1), one query position at a time.
func topLeftOutputs(ctx context.Context, in kernel.Inputs, out map[string]*tensor.Tensor) error {
	causal, err := in.Params.Bool("causal", false)
	if err != nil || !causal {
		return err
	}
	q, sl := in.Tensors["q"], in.Tensors["seq_lens"]
	if q == nil || sl == nil || len(q.Shape) != 4 || q.Shape[1] < 2 {
		return nil
	}
	for name, t := range out {
		out[name] = replaced(t)
	}
	params := clone(in.Params)
	params["causal"] = "false"
	lens := ints(sl)
	for i := 0; i < q.Shape[1]; i++ {
		ts := map[string]*tensor.Tensor{}
		for name, t := range in.Tensors {
			if name != "split_bounds" {
				ts[name] = t
			}
		}
		ts["q"] = takeAxis(q, 1, i)
		li := make([]int64, len(lens))
		for b, n := range lens {
			li[b] = min(n, int64(i+1))
		}
		ts["seq_lens"] = tensor.FromInt64s(sl.DType, sl.Shape, li)
		res, err := reproduce(ctx, "mla_decode", in.Params, kernel.Inputs{Tensors: ts, Params: params}, out)
		if err != nil {
			return err
		}
		// q_pos is axis 1 of out and the partials, axis 2 of lse [B, H, s_q].
		for name, t := range out {
			ax := 1
			if name == "lse" {
				ax = 2
			}
			if r, ok := res[name]; ok {
				putAxis(t, ax, i, r)
			}
		}
	}
	return nil
}
