package dsa

import (
	"context"
	"encoding/binary"
	"math"
	"strconv"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
	"github.com/kcheck-dev/kcheck/reference/dsa"
	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// indexerHeads and indexerDim are DeepSeek-V3.2's lightning indexer: 64
// heads of 128 (a case's heads override the first).
const indexerHeads, indexerDim = 64, 128

// Defaults implements Generator: the page size and top-k (the cache is
// bf16 only).
func (*indexer) Defaults(c Case) Params {
	p := paged.Defaults(c, false)
	p["topk"] = strconv.Itoa(c.Geometry.TopK)
	return p
}

// Generate implements Generator.
func (*indexer) Generate(ctx context.Context, c Case, r *RNG) (map[string]*tensor.Tensor, error) {
	g := c.Geometry
	seqLens := g.SeqLenList()
	heads := indexerHeads
	if c.Heads > 0 {
		heads = c.Heads
	}
	pg := paged.NewPaging(r, seqLens, g.PageSize)
	fp8 := c.Params.String("k_cache_dtype", "bf16") == "fp8_e4m3"
	// an MTP step's next_n query rows a request (q and weights rows)
	rows := len(seqLens) * int(max(IntParam(c.Params, "next_n", 1), 1))
	kv := make([]float64, pg.NB*g.PageSize*indexerDim)
	if err := Normals(ctx, r, kv); err != nil {
		return nil, err
	}
	k := tensor.FromFloat64s(tensor.BF16, []int{pg.NB, g.PageSize, indexerDim}, kv)
	q := make([]float64, rows*heads*indexerDim)
	if err := Normals(ctx, r, q); err != nil {
		return nil, err
	}
	for i, x := range q {
		q[i] = formats.RoundBF16(x)
	}
	qt := BF16([]int{rows, heads, indexerDim}, q)
	if fp8 {
		var err error
		if k, err = fp8IndexerCache(ctx, k, g.PageSize, c.Params.String("k_scale_fmt", dsa.ScaleAny) == dsa.ScaleUE8M0); err != nil {
			return nil, err
		}
		// an fp8 q is e4m3(q / q_scale) with q_scale folded into the
		// weights: the codes of a unit-scale q stand for any of them
		qt = tensor.FromFloat64s(tensor.F8E4M3, qt.Shape, q)
	}
	w := make([]float64, rows*heads)
	if err := Normals(ctx, r, w); err != nil {
		return nil, err
	}
	for i, x := range w {
		w[i] = x * 0.1
	}
	ts := paged.Tables(seqLens, pg)
	ts["q"] = qt
	ts["k_cache"] = k
	ts["weights"] = tensor.FromFloat64s(tensor.F32, []int{rows, heads}, w)
	return ts, nil
}

// PlanCost implements Generator: the estimate takes at least the
// indexer's 64 heads, whatever the case's.
func (*indexer) PlanCost(c Case, cost *Cost) Shapes {
	s, blocks, _ := paged.PlanCost(c, cost)
	g := c.Geometry
	heads := max(int64(g.Heads), indexerHeads)
	s.Dims["q"] = []int64{g.SeqLens.Count() * max(IntParam(c.Params, "next_n", 1), 1), heads, indexerDim}
	if c.Params.String("k_cache_dtype", "bf16") == "fp8_e4m3" {
		s.Dims["k_cache"] = []int64{blocks, int64(g.PageSize), indexerDim + 4}
		cost.Input("k_cache", []int64{blocks, int64(g.PageSize), indexerDim + 4}, 1)
		cost.Input("k_cache drawn in bf16 before its quantization", []int64{blocks, int64(g.PageSize), indexerDim}, 2)
	} else {
		s.Dims["k_cache"] = []int64{blocks, int64(g.PageSize), indexerDim}
		cost.Input("k_cache", []int64{blocks, int64(g.PageSize), indexerDim}, 16)
	}
	return s
}

// fp8IndexerCache writes a BF16 [NB, P, Dk] key cache as vLLM's fp8 indexer
// cache writes it: per token scale = max(amax, 1e-4) / 448, with ue8m0
// rounded up to a power of two, and codes e4m3(k / scale), stored per block
// as P·Dk codes then P F32 scales (vllm 0.33.0 vllm/_custom_ops.py:3191
// indexer_k_quant_and_cache; its Triton twin
// vllm/v1/attention/ops/rocm_aiter_mla_sparse.py:150-174: `scale =
// tl.maximum(1e-4, amax) / 448.0`, `if USE_UE8M0: scale =
// tl.exp2(tl.ceil(tl.log2(scale)))`, the codes then the scale region).
// Without a declared convention the writer is amax, as it was before
// k_scale_fmt existed.
func fp8IndexerCache(ctx context.Context, k *tensor.Tensor, p int, ue8m0 bool) (*tensor.Tensor, error) {
	nb, dk := k.Shape[0], k.Shape[2]
	out := tensor.New(tensor.U8, nb, p, dk+4)
	block := p * (dk + 4)
	row := make([]float64, dk)
	for blk := 0; blk < nb; blk++ {
		if err := ctx.Err(); err != nil { // a block is p rows
			return nil, err
		}
		for off := 0; off < p; off++ {
			k.RowInto(row, (blk*p+off)*dk, dk)
			amax := 0.0
			for _, v := range row {
				amax = math.Max(amax, math.Abs(v))
			}
			scale := float32(math.Max(amax, 1e-4)) / 448
			if ue8m0 {
				scale = float32(dsa.CeilPow2(float64(scale)))
			}
			base := blk * block
			for j, v := range row {
				out.Data[base+off*dk+j], _ = formats.E4M3FN.Encode(float64(float32(v)/scale), formats.Saturate)
			}
			binary.LittleEndian.PutUint32(out.Data[base+p*dk+4*off:], math.Float32bits(scale))
		}
	}
	return out, nil
}
