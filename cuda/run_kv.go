//go:build cuda || cudaemu

package cuda

import (
	"github.com/kcheck-dev/kcheck/internal/kernel"
	kvkernels "github.com/kcheck-dev/kcheck/internal/kernels/kvcache"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

func init() {
	runners["kv_cache_write"] = runKVWrite
	runners["kv_cache_gather"] = runKVGather
}

const (
	dsL, dsR = 512, 64
	kvWarps  = 8 // tokens a CTA (KV_WARPS in kvcache.cu)
)

// cacheKind refuses, before any validation, the caches the kernels do not
// read: the kernels read bf16 and fp8 caches only, so an fp16 one
// (kv_cache_dtype fp16, or auto over an F16 tensor) is refused as
// unsupported, never read as bf16 bits, and so are DeepSeek-V4's. It
// looks at the parameter and the tensor's dtype only: the kernel's
// Validate checks the rest.
func cacheKind(in kernel.Inputs, name string) error {
	kind := in.Params.String("kv_cache_dtype", "bf16")
	if kind == "auto" {
		if c := in.Tensors[name]; c != nil && c.DType == tensor.F16 {
			kind = "fp16"
		}
	}
	if kind == "fp16" {
		return unsupported("kv_cache_dtype %s (an F16 cache): the CUDA kernels are bf16-only (cuda/kvcache.cu, cuda/mla_decode.cu); an fp16 cache is checked against the reference, in captures and with the engine workers", in.Params.String("kv_cache_dtype", "bf16"))
	}
	if kvcache.Kind(kind).V4() {
		return unsupported("kv_cache_dtype %s (a DeepSeek-V4 sparse cache): the CUDA kernels (cuda/kvcache.cu, cuda/mla_decode.cu) have no DeepSeek-V4 layout; it is checked against the reference, in captures", kind)
	}
	return nil
}

// emptyCache refuses a cache of no block or no slot a block: the kernels
// index blocks and offsets by it.
func emptyCache(name string, t *tensor.Tensor) error {
	if t.Shape[0] == 0 || t.Shape[1] == 0 {
		return inputErr("tensor %s has shape %v; the contract wants [NB, P, entry]", name, t.Shape)
	}
	return nil
}

func runKVWrite(d *Device, in kernel.Inputs, opt RunOptions) (*Result, error) {
	if err := cacheKind(in, "cache_before"); err != nil {
		return nil, err
	}
	for _, name := range []string{"kv_c", "k_pe"} {
		if err := bf16Tokens(in, name); err != nil {
			return nil, err
		}
	}
	pr, err := validate("kv_cache_write", in)
	if err != nil {
		return nil, err
	}
	wp := pr.(*kvkernels.WriteProblem)
	kvc, kpe, before, lay := wp.KVC, wp.KPE, wp.Before, wp.Layout
	if err := emptyCache("cache_before", before); err != nil {
		return nil, err
	}
	kind := lay.Kind
	if kind == kvcache.FP8DSMLA && lay.DSScale != kvcache.ScaleAmax && lay.DSScale != kvcache.ScalePow2 {
		return nil, unsupported("ds_mla_scale = %s: the CUDA cache writer chooses amax or pow2 tile scales", lay.DSScale)
	}
	// The first T = len(slot_mapping) token rows are written; the rest
	// are CUDA-graph padding (reference/CONTRACTS.md §3.4).
	T, L, R := len(wp.Slots), lay.L, lay.R
	numSlots := int64(before.Shape[0]) * int64(lay.PageSize)
	if _, err := outDType(opt, "cache_after", before.DType, before.DType); err != nil {
		return nil, err
	}
	mod, err := d.load("kvcache")
	if err != nil {
		return nil, err
	}
	var bufs buffers
	defer bufs.free()
	dkv := bufs.upload(kvc.Data)
	dpe := bufs.upload(kpe.Data)
	dsl := bufs.upload(int64Bytes(wp.Slots))
	dc := bufs.upload(before.Data)
	l := launch{mod: mod, grid: [3]int{max(ceilDiv(T, kvWarps), 1), 1, 1}, block: kvWarps * 32}
	switch kind {
	case kvcache.BF16:
		l.fn = "kv_cache_write_bf16"
		l.args = args{uint64(dkv), uint64(dpe), uint64(dsl), uint64(dc), i32(T), i32(L), i32(R), uint64(numSlots)}
	case kvcache.FP8E4M3:
		dks := bufs.upload(f32Bytes(wp.KScale))
		l.fn = "kv_cache_write_fp8"
		l.args = args{uint64(dkv), uint64(dpe), uint64(dsl), uint64(dc), uint64(dks), i32(T), i32(L), i32(R), uint64(numSlots), i32(b2i(lay.Saturate))}
	default:
		l.fn = "kv_cache_write_ds_mla"
		l.args = args{uint64(dkv), uint64(dpe), uint64(dsl), uint64(dc), i32(T), uint64(numSlots), i32(b2i(lay.DSScale == kvcache.ScalePow2))}
	}
	var plan []launch
	if T > 0 {
		plan = append(plan, l)
	}
	res, err := d.finish(&bufs, mod, plan, opt, []outBuf{{"cache_after", dc, before.DType, before.Shape}})
	if err != nil {
		return nil, err
	}
	if kind == kvcache.FP8DSMLA {
		res.Meta["ds_mla_scale"] = string(lay.DSScale)
	}
	return res, nil
}

func runKVGather(d *Device, in kernel.Inputs, opt RunOptions) (*Result, error) {
	if err := cacheKind(in, "cache"); err != nil {
		return nil, err
	}
	// A chunked gather (seq_starts) is the plain one over the block table
	// from each request's chunk on: the problem's table is that one
	// (kvcache.Chunked).
	pr, err := validate("kv_cache_gather", in)
	if err != nil {
		return nil, err
	}
	gp := pr.(*kvkernels.GatherProblem)
	cache, lay := gp.Cache, gp.Layout
	if err := emptyCache("cache", cache); err != nil {
		return nil, err
	}
	od, err := outDType(opt, "gathered", tensor.BF16, tensor.BF16, tensor.F32)
	if err != nil {
		return nil, err
	}
	dq, err := gp.Dequant()
	if err != nil {
		return nil, asInput(err)
	}
	pages := dq.Pages
	B, maxBlocks, nb, p, dd := len(pages.SeqLens), pages.MaxBlocks, gp.NB, lay.PageSize, lay.D()
	seq, table, cu, maxSeq := pageArrays(pages)
	total := int(cu[B])
	mod, err := d.load("kvcache")
	if err != nil {
		return nil, err
	}
	var bufs buffers
	defer bufs.free()
	dc := bufs.upload(cache.Data)
	dbt := bufs.upload(int32Bytes(table))
	dsl := bufs.upload(int32Bytes(seq))
	dcu := bufs.upload(int64Bytes(cu))
	dks := uint64(0)
	if lay.Kind == kvcache.FP8E4M3 {
		pk := bufs.upload(f32Bytes(dq.KScale))
		dks = uint64(pk)
	}
	dout := bufs.alloc(int64(total * dd * od.Size()))
	L, R := dd, 0
	fn := map[kvcache.Kind]string{kvcache.BF16: "kv_cache_gather_bf16", kvcache.FP8E4M3: "kv_cache_gather_fp8", kvcache.FP8DSMLA: "kv_cache_gather_ds_mla"}[lay.Kind]
	if lay.Kind == kvcache.FP8DSMLA {
		L, R = dsL, dsR
	}
	if od == tensor.F32 {
		fn += "_f32"
	} else {
		fn += "_bf16"
	}
	var plan []launch
	if total > 0 {
		plan = []launch{{mod: mod, fn: fn, grid: [3]int{ceilDiv(maxSeq, kvWarps), B, 1}, block: kvWarps * 32,
			args: args{uint64(dc), uint64(dbt), uint64(dsl), uint64(dcu), dks, uint64(dout), i32(maxBlocks), i32(p), i32(L), i32(R), i32(nb)}}}
	}
	return d.finish(&bufs, mod, plan, opt, []outBuf{{"gathered", dout, od, []int{total, dd}}})
}

// pageArrays is a validated block table as the kernels take it: the
// lengths and table (for 32-bit upload), the cumulative lengths and the
// longest length.
func pageArrays(pages *kvcache.Pages) (seq, table, cu []int64, maxSeq int) {
	seq = make([]int64, len(pages.SeqLens))
	for b, n := range pages.SeqLens {
		seq[b] = int64(n)
		maxSeq = max(maxSeq, n)
	}
	table = make([]int64, len(pages.Table))
	for i, v := range pages.Table {
		table[i] = int64(v)
	}
	cu = make([]int64, len(pages.CuSeqLens))
	for i, v := range pages.CuSeqLens {
		cu[i] = int64(v)
	}
	return seq, table, cu, maxSeq
}

// bf16Tokens refuses a write's kv_c or k_pe of the contract's other token
// dtypes (F16, F32) as unsupported: the kernel reads bf16. A missing or
// misshapen tensor is the kernel's Validate's to name.
func bf16Tokens(in kernel.Inputs, name string) error {
	if t := in.Tensors[name]; t != nil && (t.DType == tensor.F16 || t.DType == tensor.F32) {
		return unsupported("tensor %s is %s; the CUDA cache writer reads bf16 tokens", name, t.DType)
	}
	return nil
}
