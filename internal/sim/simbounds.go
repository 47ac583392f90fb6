package sim

import (
	"fmt"
	"github.com/kcheck-dev/kcheck/internal/kernel"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The simulation's memory, estimated from its settings before anything is
// built: each setting is a number on the command line, and one of them
// (--hidden 1600000000, --prefill, --page-size, --batch, --splits, --s-q,
// --steps) multiplies into weights, caches or traces of any size. Go cannot
// recover from running out of memory, so a simulation over the bound is
// refused, as a check is (internal/check/limits.go), with the largest part
// named.

// tracesHeld is how many runs' traces a diagnosis holds at once: the
// reference run, the exact chain, the backend's run and one swapped run.
const tracesHeld = 4

// Estimate estimates the simulation of cfg (defaults filled in; cfg must
// be valid): its weights and inputs, the cache and traces of the runs it
// holds at once, and the largest kernel reference one of its steps calls.
func Estimate(cfg Config) (kernel.Estimate, error) {
	cfg = cfg.withDefaults()
	p, err := cases.LookupPreset(cfg.Preset)
	if err != nil {
		return kernel.Estimate{}, err
	}
	heads, err := p.HeadsFor(cfg.TP)
	if err != nil {
		return kernel.Estimate{}, err
	}
	H, L, R := int64(heads), int64(p.Latent), int64(p.Rope)
	D := L + R
	nope := int64(128)
	if p.Name == "glm-5" {
		nope = 192
	}
	hidden, batch, sq, page, splits := int64(cfg.Hidden), int64(cfg.Batch), int64(cfg.SQ), int64(cfg.PageSize), int64(cfg.Splits)
	prompts, steps := int64(cfg.Prompts), int64(cfg.Steps)
	sum, prod := kernel.AddSizes, kernel.MulSizes
	n := sum(prod(H, nope+R), L, R) // the projection's width
	graphBatch := int64(1)
	for graphBatch < batch && graphBatch < 1<<62 {
		graphBatch *= 2
	}
	// The prompt: request b holds Prefill+3b tokens, then Steps·SQ more.
	total := sum(prod(batch, int64(cfg.Prefill)), prod(3, batch, batch-1)/2)
	longest := sum(int64(cfg.Prefill), prod(3, batch-1), prod(steps, sq))
	// Pages: at most one partly filled page a request beyond the tokens.
	nb := sum(sum(total, prod(batch, steps, sq))/page, batch, 1)
	maxBlocks := longest/page + 1
	width := D
	switch cfg.KVCacheDType {
	case "fp8_ds_mla":
		width = 656
	}
	rows := max(total, prod(graphBatch, sq)) // the rows one projection call reads

	var e check.Estimator
	e.Add(fmt.Sprintf("weights W_in [%d, %d] and their quantization", n, hidden), n, hidden, 16)
	e.Add(fmt.Sprintf("weights W_UK [%d, %d] and their quantization", prod(H, nope), L), H, nope, L, 24)
	e.Add(fmt.Sprintf("weights W_o [%d, %d]", hidden, prod(H, L)), hidden, H, L, 8)
	e.Add(fmt.Sprintf("embeddings and output head [2 x %d, %d]", Vocab, hidden), 2, Vocab, hidden, 8)
	e.Add(fmt.Sprintf("prompt tokens [%d x %d]", prompts, total), prompts, total, 8)
	e.Add(fmt.Sprintf("prefill hidden states and their projection [%d, %d + %d]", rows, hidden, n), rows, sum(hidden, n, L, R), 16)
	e.Add(fmt.Sprintf("%d runs' caches [%d, %d, %d]", tracesHeld, nb, page, width), tracesHeld, nb, page, width, 2)
	e.Add(fmt.Sprintf("%d runs' traces of %d steps", tracesHeld, prod(prompts, steps)), tracesHeld, prompts, steps, sum(prod(batch, sq, H, L), prod(batch, sq, hidden)), 8)
	// The decode's partials live on, stored, while the combine reads them.
	e.Add(fmt.Sprintf("split-K partials [%d, %d, %d] between decode and combine", prod(batch, sq, H), splits, L), batch, sq, H, splits, L, 8)
	// The largest reference a step calls (every backend here but cuda runs
	// one in this process; the diagnosis runs them one at a time).
	shape := func(d ...int64) []int {
		out := make([]int, len(d))
		for i, v := range d {
			out[i] = int(v)
		}
		return out
	}
	t := func(dt tensor.DType, d ...int64) *tensor.Tensor { return &tensor.Tensor{DType: dt, Shape: shape(d...)} }
	N := prod(batch, sq, H)
	calls := []struct {
		kernel string
		in     map[string]*tensor.Tensor
		params map[string]string
	}{
		{"nvfp4_quantize", map[string]*tensor.Tensor{"x": t(tensor.BF16, rows, hidden)}, nil},
		{"nvfp4_gemm", map[string]*tensor.Tensor{"a_packed": t(tensor.U8, rows, hidden/2), "b_packed": t(tensor.U8, n, hidden/2)}, nil},
		{"nvfp4_dequantize", map[string]*tensor.Tensor{"packed": t(tensor.U8, prod(H, nope), L/2)}, nil},
		{"kv_cache_write", map[string]*tensor.Tensor{"cache_before": t(tensor.BF16, nb, page, width),
			"kv_c": t(tensor.BF16, rows, L), "k_pe": t(tensor.BF16, rows, R), "slot_mapping": t(tensor.I64, rows)}, nil},
		{"mla_decode", map[string]*tensor.Tensor{"q": t(tensor.BF16, batch, sq, H, D), "kv_cache": t(tensor.BF16, nb, page, width),
			"block_table": t(tensor.I32, batch, maxBlocks)}, map[string]string{"num_splits": fmt.Sprint(splits)}},
		{"splitk_combine", map[string]*tensor.Tensor{"partial_out": t(tensor.F32, N, splits, L), "partial_lse": t(tensor.F32, N, splits)}, nil},
	}
	var largest kernel.Estimate
	for _, c := range calls {
		k := check.EstimateKernel(c.kernel, c.in, c.params)
		if k.Bytes > largest.Bytes {
			largest = k
			largest.What = c.kernel + "'s " + k.What
		}
	}
	e.AddEstimate(largest)
	return e.Estimate(), nil
}
