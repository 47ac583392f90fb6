//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"math"
	"strconv"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	splitkkernel "github.com/kcheck-dev/kcheck/internal/kernels/splitk"
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

// lseParams reads lse_base and lse_empty (reference/CONTRACTS.md §3.6).
func lseParams(p kernel.Params) (base2, emptyPos bool, err error) {
	b, err := p.Enum("lse_base", "e", "e", "2")
	if err != nil {
		return false, false, asInput(err)
	}
	e, err := p.Enum("lse_empty", "-inf", "-inf", "+inf", "inf")
	if err != nil {
		return false, false, asInput(err)
	}
	return b == "2", e != "-inf", nil
}

func runMLA(d *Device, in kernel.Inputs, opt RunOptions, sparse bool) (*Result, error) {
	q, err := kernel.Need(in, "q", tensor.BF16, tensor.F16, tensor.F32)
	if err != nil {
		return nil, asInput(err)
	}
	if len(q.Shape) != 4 {
		return nil, inputErr("tensor q has shape %v; the contract wants [B, s_q, H, D]", q.Shape)
	}
	if q.DType != tensor.BF16 {
		return nil, unsupported("tensor q is %s; the CUDA MLA decode reads bf16 queries", q.DType)
	}
	B, sq, H, D := q.Shape[0], q.Shape[1], q.Shape[2], q.Shape[3]
	if D != mlaD {
		return nil, unsupported("tensor q has D = %d; the CUDA MLA decode is built for D = %d (L = %d, R = 64)", D, mlaD, mlaL)
	}
	if l, err := in.Params.Int("latent_dim", mlaL); err != nil || l != mlaL {
		if err != nil {
			return nil, asInput(err)
		}
		return nil, unsupported("parameter latent_dim = %d; the CUDA MLA decode is built for L = %d", l, mlaL)
	}
	kind, cache, nb, p, dd, err := cacheSpec(in, "kv_cache")
	if err != nil {
		return nil, err
	}
	if dd != mlaD {
		return nil, inputErr("tensor q has D = %d but kv_cache rows hold %d values (shape %v)", D, dd, cache.Shape)
	}
	scale, err := in.Params.RequiredFloat("softmax_scale")
	if err != nil {
		return nil, asInput(err)
	}
	causal, err := in.Params.Bool("causal", false)
	if err != nil {
		return nil, asInput(err)
	}
	base2, emptyPos, err := lseParams(in.Params)
	if err != nil {
		return nil, err
	}
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
	if sparse {
		it, err := kernel.Need(in, "indices", indexDTypes...)
		if err != nil {
			return nil, asInput(err)
		}
		if len(it.Shape) != 3 || it.Shape[0] != B || it.Shape[1] != sq {
			return nil, inputErr("tensor indices has shape %v; the contract wants [B = %d, s_q = %d, topk]", it.Shape, B, sq)
		}
		topk = it.Shape[2]
		if k, err := in.Params.Int("topk", topk); err != nil || k != topk {
			if err != nil {
				return nil, asInput(err)
			}
			return nil, inputErr("parameter topk = %d but tensor indices has topk = %d", k, topk)
		}
		if int64(nb)*int64(p) > math.MaxInt32 {
			return nil, unsupported("cache of %d slots: the CUDA sparse decode indexes slots with int32", int64(nb)*int64(p))
		}
		idx := indexData(it)
		for i, v := range idx {
			// Any slot outside the cache means "not attended" (reference/CONTRACTS.md §3.7);
			// squash what int32 cannot hold to -1 on the way.
			if v < 0 || v > math.MaxInt32 {
				idx[i] = -1
			}
		}
		pi := bufs.upload(int32Bytes(idx))
		didx, longest = ptrArg(pi), topk
	} else {
		bt, err := kernel.Need(in, "block_table", indexDTypes...)
		if err != nil {
			return nil, asInput(err)
		}
		sl, err := kernel.Need(in, "seq_lens", indexDTypes...)
		if err != nil {
			return nil, asInput(err)
		}
		if len(bt.Shape) != 2 || bt.Shape[0] != B || len(sl.Shape) != 1 || sl.Shape[0] != B {
			return nil, inputErr("tensors block_table %v and seq_lens %v must be [B = %d, max_blocks] and [B]", bt.Shape, sl.Shape, B)
		}
		maxBlocks = bt.Shape[1]
		seq, table, _, maxSeq, err := pagedTable(bt, sl, nb, p)
		if err != nil {
			return nil, err
		}
		pb := bufs.upload(int32Bytes(table))
		ps := bufs.upload(int32Bytes(seq))
		dbt, dsl, longest = ptrArg(pb), ptrArg(ps), maxSeq
	}
	if kind == "fp8_e4m3" {
		_, ks, err := scalarF32(in, "k_scale")
		if err != nil {
			return nil, err
		}
		pk := bufs.upload(ks)
		dks = ptrArg(pk)
	}

	// Variant: 64-row CTAs when a request has >= 64 query rows and the
	// device has the shared memory, else 16-row CTAs.
	rows := sq * H
	ctasY := B
	if sparse {
		rows, ctasY = H, B*sq
	}
	cacheName := map[string]string{"bf16": "bf16", "fp8_e4m3": "fp8", "fp8_ds_mla": "ds_mla"}[kind]
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
		s := mlaSmemBytes(c.mt, int(c.suffix[len(c.suffix)-1]-'0'), kind)
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

	// Splits: the num_splits parameter, else mlaSplits' wave-rounded count
	// (at least 2 tiles a split, at most maxSplits).
	S, err := in.Params.Int("num_splits", 0)
	if err != nil {
		return nil, asInput(err)
	}
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
		dpo, dpl = ptrArg(po), ptrArg(pl)
		if !sparse {
			sb := bufs.alloc(int64(B * (S + 1) * 4))
			dsb = ptrArg(sb)
		}
	}
	scaleLog2 := float32(scale * math.Log2E)
	plan := []launch{{mod: mod, fn: fn, grid: [3]int{rowBlocks, ctasY, S}, block: 128 * mt, smem: smem,
		args: args{ptrArg(dq), ptrArg(dkv), dbt, dsl, didx, dks, ptrArg(dout), ptrArg(dlse), dpo, dpl, dsb,
			i32(B), i32(sq), i32(H), i32(maxBlocks), i32(p), i32(nb), i32(topk), i32(S), f32(scaleLog2),
			i32(b2i(causal)), i32(b2i(base2)), i32(b2i(emptyPos))}}}
	if S > 1 {
		plan = append(plan, launch{mod: mod, fn: "splitk_combine_bf16", grid: [3]int{nRows, 1, 1}, block: 128,
			args: args{dpo, dpl, ptrArg(dout), ptrArg(dlse), i32(nRows), i32(S), i32(mlaL),
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
			outBuf{"partial_out", cuPtr(dpo), tensor.F32, []int{B, sq, H, S, mlaL}},
			outBuf{"partial_lse", cuPtr(dpl), tensor.F32, []int{B, sq, H, S}},
			outBuf{"split_bounds", cuPtr(dsb), tensor.I32, []int{B, S + 1}})
	}
	res, err := d.finish(&bufs, mod, plan, opt, outs)
	if err != nil {
		return nil, err
	}
	if S > 1 && !sparse {
		res.Meta["num_splits"] = strconv.Itoa(S)
	}
	res.Meta["kcheck.cuda.splits"] = strconv.Itoa(S)
	return res, nil
}

func runSplitK(d *Device, in kernel.Inputs, opt RunOptions) (*Result, error) {
	// The one validation of the inputs is the kernel's own.
	k, err := kernel.Lookup("splitk_combine")
	if err != nil {
		return nil, err
	}
	p, err := kernel.Validate(k, in)
	if err != nil {
		return nil, asInput(err)
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
			args: args{ptrArg(dpo), ptrArg(dpl), ptrArg(dout), ptrArg(dlse), i32(N), i32(S), i32(L),
				i32(b2i(base2)), i32(b2i(emptyPos)), i32(0), i32(1), i32(1)}}}
	}
	return d.finish(&bufs, mod, plan, opt, []outBuf{{"out", dout, od, []int{N, L}}, {"lse", dlse, tensor.F32, []int{N}}})
}
