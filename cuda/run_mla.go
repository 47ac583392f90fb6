//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"math"
	"strconv"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	mlakernel "github.com/kcheck-dev/kcheck/internal/kernels/mla"
	splitkkernel "github.com/kcheck-dev/kcheck/internal/kernels/splitk"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/splitk"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

func init() {
	runners["mla_decode"] = func(d *Device, in kernel.Inputs, opt RunOptions) (*Result, error) {
		return runMLA(d, in, opt, false)
	}
	runners["mla_decode_sparse"] = func(d *Device, in kernel.Inputs, opt RunOptions) (*Result, error) {
		// cuda/mla_decode.cu's sparse variant has no sink and reads every index
		for _, n := range []string{"topk_length", "attn_sink"} {
			if in.Tensors[n] != nil {
				return nil, unsupported("tensor %s: kcheck's CUDA sparse decode does not implement FlashMLA's %s", n, n)
			}
		}
		return runMLA(d, in, opt, true)
	}
	runners["splitk_combine"] = runSplitK
}

const maxSplits = 64

func runMLA(d *Device, in kernel.Inputs, opt RunOptions, sparse bool) (*Result, error) {
	// What the kernels do not implement is refused first, from the
	// dtypes, the query's width and the parameters, before any
	// validation: a DeepSeek-V4 cache's query is not even of the width
	// this decode reads, and is refused for that.
	if q := in.Tensors["q"]; q != nil {
		if q.DType == tensor.F16 || q.DType == tensor.F32 {
			return nil, unsupported("tensor q is %s; the CUDA MLA decode reads bf16 queries", q.DType)
		}
		if len(q.Shape) == 4 && q.Shape[3] != mlaD {
			return nil, unsupported("tensor q has D = %d; the CUDA MLA decode is built for D = %d (L = %d, R = 64)", q.Shape[3], mlaD, mlaL)
		}
	}
	if l, err := in.Params.Int("latent_dim", mlaL); err == nil && l != mlaL {
		return nil, unsupported("parameter latent_dim = %d; the CUDA MLA decode is built for L = %d", l, mlaL)
	}
	if err := cacheKind(in, "kv_cache"); err != nil {
		return nil, err
	}
	name := "mla_decode"
	if sparse {
		name = "mla_decode_sparse"
	}
	pr, err := validate(name, in)
	if err != nil {
		return nil, err
	}
	var cm *mlakernel.Common
	switch p := pr.(type) {
	case *mlakernel.DecodeProblem:
		cm = &p.Common
	case *mlakernel.SparseProblem:
		cm = &p.Common
	}
	q, cache, lay := cm.QT, cm.KVCache, cm.Layout
	B, sq, H := cm.Q.B, cm.Q.SQ, cm.Q.H
	if err := emptyCache("kv_cache", cache); err != nil {
		return nil, err
	}
	kind, nb, p := lay.Kind, cm.Cache.NB, lay.PageSize
	scale, causal := cm.Config.SoftmaxScale, cm.Config.Causal
	base2, emptyPos := cm.Config.LSE.Base == splitk.Base2, math.IsInf(cm.Config.LSE.Empty, 1)
	if _, err := outDType(opt, "out", tensor.BF16, tensor.BF16); err != nil {
		return nil, err
	}
	if _, err := outDType(opt, "lse", tensor.F32, tensor.F32); err != nil {
		return nil, err
	}

	mod, err := d.load("mla_decode")
	if err != nil {
		return nil, err
	}
	var bufs buffers
	defer bufs.free()
	dq := bufs.upload(q.Data)
	dkv := bufs.upload(cache.Data)
	var dbt, dsl, didx, dks uint64
	maxBlocks, topk, longest := 0, 0, 0
	// S: the problem's split count for the dense decode, the num_splits
	// parameter for the sparse one, whose contract has no partials; 0:
	// the launcher chooses.
	S := 0
	switch p := pr.(type) {
	case *mlakernel.SparseProblem:
		topk = p.Sparse.TopK
		if int64(nb)*int64(lay.PageSize) > math.MaxInt32 {
			return nil, unsupported("cache of %d slots: the CUDA sparse decode indexes slots with int32", int64(nb)*int64(lay.PageSize))
		}
		idx := append([]int64(nil), p.Sparse.Indices...)
		for i, v := range idx {
			// Any slot outside the cache means "not attended" (reference/CONTRACTS.md §3.7);
			// squash what int32 cannot hold to -1 on the way.
			if v < 0 || v > math.MaxInt32 {
				idx[i] = -1
			}
		}
		pi := bufs.upload(int32Bytes(idx))
		didx, longest = uint64(pi), topk
		if S, err = in.Params.Int("num_splits", 0); err != nil {
			return nil, asInput(err)
		}
	case *mlakernel.DecodeProblem:
		maxBlocks = p.Pages.MaxBlocks
		seq, table, _, maxSeq := pageArrays(p.Pages)
		pb := bufs.upload(int32Bytes(table))
		ps := bufs.upload(int32Bytes(seq))
		dbt, dsl, longest = uint64(pb), uint64(ps), maxSeq
		S = p.S
		if n, _ := in.Params.Int("num_splits", 0); p.Bounds != nil && n == 0 {
			// S from a given split_bounds alone: the kernel places its own
			// splits (and writes them), so it chooses S too
			S = 0
		}
	}
	if kind == kvcache.FP8E4M3 {
		pk := bufs.upload(f32Bytes(cm.Cache.KScale))
		dks = uint64(pk)
	}

	// Variant: 64-row CTAs when a request has >= 64 query rows and the
	// device has the shared memory, else 16-row CTAs.
	rows := sq * H
	ctasY := B
	if sparse {
		rows, ctasY = H, B*sq
	}
	cacheName := map[kvcache.Kind]string{kvcache.BF16: "bf16", kvcache.FP8E4M3: "fp8", kvcache.FP8DSMLA: "ds_mla"}[kind]
	prefix := "mla_decode_"
	if sparse {
		prefix = "mla_decode_sparse_"
	}
	fn, mt, smem := "", 1, 0
	cands := []struct {
		suffix string
		mt     int
	}{{"_m1_s2", 1}}
	if rows >= 64 {
		cands = []struct {
			suffix string
			mt     int
		}{{"_m4_s3", 4}, {"_m4_s2", 4}, {"_m1_s2", 1}}
	}
	for _, c := range cands {
		s := mlaSmemBytes(c.mt, int(c.suffix[len(c.suffix)-1]-'0'), string(kind))
		// The module states its own layout size; a disagreement means this
		// file and mla_decode.cu drifted apart.
		if ms, err := mod.globalInt(prefix + cacheName + c.suffix + "_smem"); err == nil && ms != s {
			return nil, fmt.Errorf("%s: the module needs %d bytes of shared memory, the launcher computed %d (mla_decode.cu and run_mla.go disagree)", prefix+cacheName+c.suffix, ms, s)
		}
		if s <= d.Info.SmemOptin {
			fn, mt, smem = prefix+cacheName+c.suffix, c.mt, s
			break
		}
	}
	if fn == "" {
		return nil, unsupported("the device allows %d bytes of shared memory a block; the smallest MLA decode variant needs more", d.Info.SmemOptin)
	}
	rowBlocks := ceilDiv(rows, 16*mt)

	// Splits: S above, else mlaSplits' wave-rounded count (at least 2
	// tiles a split, at most maxSplits).
	if S < 0 || S > 4096 {
		return nil, inputErr("parameter num_splits = %d: want 1..4096", S)
	}
	if S == 0 {
		perSM := min(max(d.Info.SmemOptin/smem, 1), 4)
		S = mlaSplits(rowBlocks*ctasY, d.Info.SMs*perSM, min(max(ceilDiv(longest, 2*mlaBN), 1), maxSplits))
	}
	nRows := B * sq * H
	dout := bufs.alloc(int64(nRows * mlaL * 2))
	dlse := bufs.alloc(int64(nRows * 4))
	var dpo, dpl, dsb uint64
	if S > 1 {
		po := bufs.alloc(int64(nRows) * int64(S) * mlaL * 4)
		pl := bufs.alloc(int64(nRows * S * 4))
		dpo, dpl = uint64(po), uint64(pl)
		if !sparse {
			sb := bufs.alloc(int64(B * (S + 1) * 4))
			dsb = uint64(sb)
		}
	}
	scaleLog2 := float32(scale * math.Log2E)
	plan := []launch{{mod: mod, fn: fn, grid: [3]int{rowBlocks, ctasY, S}, block: 128 * mt, smem: smem,
		args: args{uint64(dq), uint64(dkv), dbt, dsl, didx, dks, uint64(dout), uint64(dlse), dpo, dpl, dsb,
			i32(B), i32(sq), i32(H), i32(maxBlocks), i32(p), i32(nb), i32(topk), i32(S), f32(scaleLog2),
			i32(b2i(causal)), i32(b2i(base2)), i32(b2i(emptyPos))}}}
	if S > 1 {
		plan = append(plan, launch{mod: mod, fn: "splitk_combine_bf16", grid: [3]int{nRows, 1, 1}, block: 128,
			args: args{dpo, dpl, uint64(dout), uint64(dlse), i32(nRows), i32(S), i32(mlaL),
				i32(b2i(base2)), i32(b2i(emptyPos)), i32(1), i32(sq), i32(H)}})
	}
	if B == 0 || rows == 0 {
		plan = nil
	}
	outs := []outBuf{
		{"out", dout, tensor.BF16, []int{B, sq, H, mlaL}},
		{"lse", dlse, tensor.F32, []int{B, H, sq}},
	}
	if S > 1 && !sparse {
		outs = append(outs,
			outBuf{"partial_out", devPtr(dpo), tensor.F32, []int{B, sq, H, S, mlaL}},
			outBuf{"partial_lse", devPtr(dpl), tensor.F32, []int{B, sq, H, S}},
			outBuf{"split_bounds", devPtr(dsb), tensor.I32, []int{B, S + 1}})
	}
	res, err := d.finish(&bufs, mod, plan, opt, outs)
	if err != nil {
		return nil, err
	}
	switch {
	case S > 1 && !sparse:
		res.Meta["num_splits"] = strconv.Itoa(S)
	case !sparse:
		res.Drop = append(res.Drop, "num_splits") // no partials were written: S = 1
	}
	res.Meta["kcheck.cuda.splits"] = strconv.Itoa(S)
	return res, nil
}

func runSplitK(d *Device, in kernel.Inputs, opt RunOptions) (*Result, error) {
	// The one validation of the inputs is the kernel's own.
	p, err := validate("splitk_combine", in)
	if err != nil {
		return nil, err
	}
	cp := p.(*splitkkernel.CombineProblem)
	po, pl := cp.PartialOut, cp.PartialLSE
	N, S, L := cp.N, cp.S, cp.L
	// The CUDA combine reads fp32 partials and writes the contract's
	// empty row; the reference takes more (bf16/fp16 merges, engines'
	// empty-row conventions), which this launcher refuses by name.
	if po.DType != tensor.F32 || pl.DType != tensor.F32 {
		return nil, asInput(fmt.Errorf("the CUDA splitk_combine takes F32 partials; partial_out is %s, partial_lse %s", po.DType, pl.DType))
	}
	if cp.EmptyRow != splitkkernel.EmptyZero || !math.IsInf(cp.Convention.Empty, 0) {
		return nil, asInput(fmt.Errorf("the CUDA splitk_combine writes empty rows as out 0, lse ±inf; empty_row = %s, lse_empty = %v are the reference's only", cp.EmptyRow, cp.Convention.Empty))
	}
	base2, emptyPos := cp.Convention.Base == splitk.Base2, math.IsInf(cp.Convention.Empty, 1)
	od, err := outDType(opt, "out", tensor.BF16, tensor.BF16, tensor.F32)
	if err != nil {
		return nil, err
	}
	if _, err := outDType(opt, "lse", tensor.F32, tensor.F32); err != nil {
		return nil, err
	}
	mod, err := d.load("mla_decode")
	if err != nil {
		return nil, err
	}
	var bufs buffers
	defer bufs.free()
	dpo := bufs.upload(po.Data)
	dpl := bufs.upload(pl.Data)
	dout := bufs.alloc(int64(N * L * od.Size()))
	dlse := bufs.alloc(int64(N * 4))
	fn := "splitk_combine_bf16"
	if od == tensor.F32 {
		fn = "splitk_combine_f32"
	}
	var plan []launch
	if N > 0 {
		plan = []launch{{mod: mod, fn: fn, grid: [3]int{N, 1, 1}, block: 128,
			args: args{uint64(dpo), uint64(dpl), uint64(dout), uint64(dlse), i32(N), i32(S), i32(L),
				i32(b2i(base2)), i32(b2i(emptyPos)), i32(0), i32(1), i32(1)}}}
	}
	return d.finish(&bufs, mod, plan, opt, []outBuf{{"out", dout, od, []int{N, L}}, {"lse", dlse, tensor.F32, []int{N}}})
}
