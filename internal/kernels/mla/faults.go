package mla

import (
	"context"
	"fmt"
	"math"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/faults"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Attention faults (stage attn): the MLA decode kernels.

// latentDim is the L of a q tensor [.., D] as the decode kernels read it:
// the latent_dim parameter, else D - 64 when D > 64.
func latentDim(q *tensor.Tensor, p kernel.Params) (int, error) {
	d := q.Shape[len(q.Shape)-1]
	l := d
	if d > 64 {
		l = d - 64
	}
	return p.Int("latent_dim", l)
}

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

// denseOn and sparseOn are the signature cases on each decode: a trigger
// case edited for a pattern the triggers are too small to show.
func denseOn(sq int, edit func(*cases.Case)) *faults.Trigger {
	c := mlaCase(sq)
	edit(&c)
	return &faults.Trigger{Case: c}
}

func sparseOn(edit func(*cases.Case)) *faults.Trigger {
	c := mlaCase(1)
	c.Kernel, c.Name, c.TopK = "mla_decode_sparse", "trigger/mla_decode_sparse", 16
	edit(&c)
	return &faults.Trigger{Case: c}
}

// Case edits for the patterns; each says what the pattern needs.
var (
	// manyContexts: a growth needs at least four context lengths (the
	// triggers have two requests).
	manyContexts = func(c *cases.Case) { c.SeqLens = []int{2, 5, 9, 20, 50, 120, 300, 700} }
	// manyAttended: the same for a sparse decode, whose context is the
	// slots it attends, at most top-k of them.
	manyAttended = func(c *cases.Case) { manyContexts(c); c.TopK = 1024 }
	// manyHeads: two heads of four are half the elements, which no
	// concentration may be; sixteen heads (TP 8) leave two an eighth.
	manyHeads = func(c *cases.Case) { c.TP = 8 }
)

// headAxis is the head axis of each decode output.
var headAxis = map[string]int{"out": 2, "lse": 1, "partial_out": 2, "partial_lse": 2}

func init() {
	faults.Register(&faults.Fault{
		Name: "softmax_scale_default", Stage: kernel.StageAttn, Kernels: decodeKernels,
		Needs:    "a request that attends at least one token",
		BugClass: "softmax scale left at FlashMLA's default 576^-0.5 instead of the model's qk_head_dim^-0.5·mscale^2 (0.1352 for DeepSeek-V3)",
		Doc:      "The kernel ignores the softmax_scale it is given and uses 1/sqrt(576) = 0.0417, flattening every attention distribution.",
		Params: func(p kernel.Params) kernel.Params {
			p["softmax_scale"] = fmt.Sprint(flashMLADefaultScale)
			return p
		},
		Trigger: &faults.Trigger{Case: mlaCase(1)},
		Signatures: []faults.Expect{
			{On: denseOn(1, manyContexts), Tensor: "out", Pattern: "growth_with_context", Coord: kernel.KindContextLen},
			{On: sparseOn(manyAttended), Tensor: "out", Pattern: "growth_with_context", Coord: kernel.KindContextLen},
		},
	})
	faults.Register(&faults.Fault{
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
			c := q.Clone()
			for i := 0; i < c.Len(); i++ {
				if i%d >= l {
					c.SetFloat64(i, 0)
				}
			}
			in["q"] = c
			return in, nil
		},
		Trigger: &faults.Trigger{Case: mlaCase(1)},
		Signatures: []faults.Expect{
			{On: denseOn(1, manyContexts), Tensor: "out", Pattern: "growth_with_context", Coord: kernel.KindContextLen},
			{On: sparseOn(manyAttended), Tensor: "out", Pattern: "growth_with_context", Coord: kernel.KindContextLen},
		},
	})
	faults.Register(&faults.Fault{
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
			_, page, _, err := paged.CacheGeometry(in["kv_cache"], p, "kv_cache")
			if err != nil {
				return nil, err
			}
			lens := faults.Ints(sl)
			for b, n := range lens {
				lens[b] = min((n+int64(page)-1)/int64(page)*int64(page), int64(bt.Shape[1]*page))
			}
			in["seq_lens"] = tensor.FromInt64s(sl.DType, sl.Shape, lens)
			if sb, ok := in["split_bounds"]; ok && len(sb.Shape) == 2 {
				bounds := faults.Ints(sb)
				s1 := sb.Shape[1]
				for b := range lens {
					bounds[b*s1+s1-1] = lens[b]
				}
				in["split_bounds"] = tensor.FromInt64s(sb.DType, sb.Shape, bounds)
			}
			return in, nil
		},
		Trigger: &faults.Trigger{Case: mlaCase(1)},
		Signatures: []faults.Expect{
			{Tensor: "out", Pattern: "non_finite", Why: "the tail past seq_len holds NaN-poisoned slots, attended by every row of the request"},
		},
	})
	faults.Register(&faults.Fault{
		Name: "causal_mask_top_left", Stage: kernel.StageAttn, Kernels: []string{"mla_decode"},
		Needs:    "s_q > 1 (causal = true) with a context longer than s_q",
		BugClass: "causal mask aligned top-left (FlashAttention before 2.1) instead of bottom-right for s_q > 1 (MTP, speculative decoding)",
		Doc: "Query i of s_q sees tokens 0..i instead of the first seq_len - s_q + 1 + i: with a long context every speculative " +
			"query attends only the first few tokens. Decode with s_q = 1 is unaffected.",
		Outputs: topLeftOutputs,
		Trigger: &faults.Trigger{Case: mlaCase(2)}, Simulate: map[string]string{"s-q": "2"},
		Signatures: []faults.Expect{
			{On: denseOn(2, manyContexts), Tensor: "out", Pattern: "growth_with_context", Coord: kernel.KindContextLen},
		},
	})
	faults.Register(&faults.Fault{
		Name: "bf16_accumulation", Stage: kernel.StageAttn, Kernels: decodeKernels,
		Needs:    "a request that attends at least one token",
		BugClass: "reductions accumulated in bf16 instead of fp32 (an MMA accumulator or a PV sum declared bf16)",
		Doc:      "The QK^T and PV reductions round to bf16 after every step: relative errors of ~1e-2 that grow with the context.",
		Precision: func(p kernel.Precision) kernel.Precision {
			p.Acc = tensor.BF16
			return p
		},
		Trigger: &faults.Trigger{Case: mlaCase(1)},
		Signatures: []faults.Expect{
			{On: denseOn(1, manyContexts), Tensor: "out", Pattern: "growth_with_context", Coord: kernel.KindContextLen},
			{On: sparseOn(manyAttended), Tensor: "out", Pattern: "growth_with_context", Coord: kernel.KindContextLen},
		},
	})
	faults.Register(&faults.Fault{
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
				t = t.Clone()
				faults.SwapAxis(t, ax, 0, 1)
				out[name] = t
			}
			return nil
		},
		Trigger: &faults.Trigger{Case: mlaCase(1)},
		Signatures: []faults.Expect{
			{On: denseOn(1, manyHeads), Tensor: "out", Pattern: "head_group", Coord: kernel.KindHead},
			{On: sparseOn(manyHeads), Tensor: "out", Pattern: "head_group", Coord: kernel.KindHead},
		},
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
		out[name] = t.Clone()
	}
	params := faults.CloneParams(in.Params)
	params["causal"] = "false"
	lens := faults.Ints(sl)
	for i := 0; i < q.Shape[1]; i++ {
		ts := map[string]*tensor.Tensor{}
		for name, t := range in.Tensors {
			if name != "split_bounds" {
				ts[name] = t
			}
		}
		ts["q"] = faults.TakeAxis(q, 1, i)
		li := make([]int64, len(lens))
		for b, n := range lens {
			li[b] = min(n, int64(i+1))
		}
		ts["seq_lens"] = tensor.FromInt64s(sl.DType, sl.Shape, li)
		res, err := faults.Reproduce(ctx, "mla_decode", in.Params, kernel.Inputs{Tensors: ts, Params: params}, out)
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
				faults.PutAxis(t, ax, i, r)
			}
		}
	}
	return nil
}
