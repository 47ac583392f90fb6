package mla

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// TestMLADecodeSparsePaddedHeads: FlashMLA's sparse decode takes h_q = 64
// or 128 only (FlashMLA@9241ae3 csrc/api/sparse_decode.h:328-334; audit
// F11), so vLLM pads the query with zero heads before the call and slices
// out and lse after it (vllm 0.33.0 flashmla_sparse.py:715-718,
// _compute_fp8_decode_padded_heads; :1294-1319). A capture taken at
// flash_mla_with_kvcache holds all 64 heads. Each head is independent, so
// the real heads must come out as they do unpadded, and a zero query row
// scores every attended token 0: its out is the plain mean of their V and
// its lse ln(n), answers known without the reference.
func TestMLADecodeSparsePaddedHeads(t *testing.T) {
	const realHeads, padded, l, r, n = 2, 64, 12, 4, 8
	rng := rand.New(rand.NewPCG(11, 12))
	in := mlaInputs(rng, []int{n}, 1, realHeads, l, r, 4)
	var idx []int64
	for tk := 0; tk < n; tk++ {
		idx = append(idx, in.Tensors["block_table"].Int64At(tk/4)*4+int64(tk%4))
	}
	indices := tensor.FromInt64s(tensor.I32, []int{1, 1, n}, idx)
	q := in.Tensors["q"]
	d := l + r
	qp := tensor.New(q.DType, 1, 1, padded, d)
	for i := 0; i < q.Len(); i++ {
		qp.SetFloat64(i, q.Float64At(i)) // heads 0..1 first, the rest zero
	}
	sparse, _ := Lookup("mla_decode_sparse")
	run := func(q *tensor.Tensor) (out, lse Output) {
		t.Helper()
		outs, err := Evaluate(context.Background(), sparse, Inputs{Tensors: map[string]*tensor.Tensor{
			"q": q, "kv_cache": in.Tensors["kv_cache"], "indices": indices,
		}, Params: in.Params}, DefaultPrecision(), nil)
		if err != nil {
			t.Fatal(err)
		}
		return outputNamed(t, outs, "out"), outputNamed(t, outs, "lse")
	}
	out, lse := run(q)
	pout, plse := run(qp)
	for h := 0; h < realHeads; h++ {
		for j := 0; j < l; j++ {
			i, pi := h*l+j, h*l+j
			if out.Exact.At(i) != pout.Exact.At(pi) || out.Expected.At(i) != pout.Expected.At(pi) {
				t.Fatalf("real head %d out[%d]: padded %v/%v, unpadded %v/%v", h, j, pout.Exact.At(pi), pout.Expected.At(pi), out.Exact.At(i), out.Expected.At(i))
			}
		}
		if lse.Exact.At(h) != plse.Exact.At(h) {
			t.Fatalf("real head %d lse: padded %v, unpadded %v", h, plse.Exact.At(h), lse.Exact.At(h))
		}
	}
	cache := in.Tensors["kv_cache"]
	for h := realHeads; h < padded; h++ {
		for j := 0; j < l; j++ {
			var mean float64
			for _, s := range idx {
				mean += cache.Float64At(int(s)*d + j)
			}
			mean /= n
			if got := pout.Exact.At(h*l + j); math.Abs(got-mean) > 1e-12*math.Max(1, math.Abs(mean)) {
				t.Fatalf("zero-query head %d out[%d] = %v, want the mean of V %v", h, j, got, mean)
			}
		}
		if got := plse.Exact.At(h); math.Abs(got-math.Log(n)) > 1e-12 {
			t.Fatalf("zero-query head %d lse = %v, want ln %d = %v", h, got, n, math.Log(n))
		}
	}
}
