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

var (
	indexDTypes = []tensor.DType{tensor.I32, tensor.I64}
	cacheKinds  = []string{"bf16", "fp8_e4m3", "fp8_ds_mla"}
)

// cacheSpec checks a cache tensor against kv_cache_dtype and page_size and
// returns NB, P and the values a row (D; 656 bytes hold D = 576 for ds_mla).
// The kernels read bf16 and fp8 caches only: an fp16 one (kv_cache_dtype
// fp16, or auto over an F16 tensor) is refused as unsupported, never read
// as bf16 bits.
func cacheSpec(in kernel.Inputs, name string) (kind string, t *tensor.Tensor, nb, p, d int, err error) {
	kind = in.Params.String("kv_cache_dtype", "bf16")
	if kind == "auto" {
		if c := in.Tensors[name]; c != nil && c.DType == tensor.BF16 {
			kind = "bf16"
		} else if c != nil && c.DType == tensor.F16 {
			kind = "fp16"
		}
	}
	if kind == "fp16" {
		return "", nil, 0, 0, 0, unsupported("kv_cache_dtype %s (an F16 cache): the CUDA kernels are bf16-only (cuda/kvcache.cu, cuda/mla_decode.cu); an fp16 cache is checked against the reference, in captures and with the engine workers", in.Params.String("kv_cache_dtype", "bf16"))
	}
	if kvcache.Kind(kind).V4() {
		return "", nil, 0, 0, 0, unsupported("kv_cache_dtype %s (a DeepSeek-V4 sparse cache): the CUDA kernels (cuda/kvcache.cu, cuda/mla_decode.cu) have no DeepSeek-V4 layout; it is checked against the reference, in captures", kind)
	}
	kind, err = in.Params.Enum("kv_cache_dtype", "bf16", cacheKinds...)
	if err != nil {
		return "", nil, 0, 0, 0, asInput(err)
	}
	switch kind {
	case "bf16":
		t, err = kernel.Need(in, name, tensor.BF16)
	case "fp8_e4m3":
		t, err = kernel.Need(in, name, tensor.U8, tensor.F8E4M3)
	default:
		t, err = kernel.Need(in, name, tensor.U8)
	}
	if err != nil {
		return "", nil, 0, 0, 0, asInput(err)
	}
	if len(t.Shape) != 3 || t.Shape[0] == 0 || t.Shape[1] == 0 {
		return "", nil, 0, 0, 0, inputErr("tensor %s has shape %v; the contract wants [NB, P, entry]", name, t.Shape)
	}
	nb, p, d = t.Shape[0], t.Shape[1], t.Shape[2]
	if kind == "fp8_ds_mla" {
		if d != dsEntry {
			return "", nil, 0, 0, 0, inputErr("tensor %s has shape %v; fp8_ds_mla entries are %d bytes", name, t.Shape, dsEntry)
		}
		d = dsL + dsR
	}
	ps, err := in.Params.Int("page_size", p)
	if err != nil {
		return "", nil, 0, 0, 0, asInput(err)
	}
	if ps != p {
		return "", nil, 0, 0, 0, inputErr("parameter page_size = %d but tensor %s has P = %d (shape %v)", ps, name, p, t.Shape)
	}
	return kind, t, nb, p, d, nil
}

func runKVWrite(d *Device, in kernel.Inputs, opt RunOptions) (*Result, error) {
	kind, before, nb, p, dd, err := cacheSpec(in, "cache_before")
	if err != nil {
		return nil, err
	}
	kvc, err := bf16Tokens(in, "kv_c")
	if err != nil {
		return nil, err
	}
	kpe, err := bf16Tokens(in, "k_pe")
	if err != nil {
		return nil, err
	}
	sm, err := kernel.Need(in, "slot_mapping", indexDTypes...)
	if err != nil {
		return nil, asInput(err)
	}
	if len(kvc.Shape) != 2 || len(kpe.Shape) != 2 || len(sm.Shape) != 1 ||
		kpe.Shape[0] != kvc.Shape[0] || sm.Shape[0] != kvc.Shape[0] {
		return nil, inputErr("tensors kv_c %v, k_pe %v and slot_mapping %v must be [T, L], [T, R] and [T]", kvc.Shape, kpe.Shape, sm.Shape)
	}
	T, L, R := kvc.Shape[0], kvc.Shape[1], kpe.Shape[1]
	if L+R != dd {
		return nil, inputErr("kv_c has L = %d and k_pe R = %d, but cache_before rows hold D = %d (shape %v)", L, R, dd, before.Shape)
	}
	if kind == "fp8_ds_mla" && (L != dsL || R != dsR) {
		return nil, inputErr("fp8_ds_mla needs L = %d and R = %d, got %d and %d", dsL, dsR, L, R)
	}
	if _, err := outDType(opt, "cache_after", before.DType, before.DType); err != nil {
		return nil, err
	}
	slots := indexData(sm)
	numSlots := int64(nb) * int64(p)
	for i, s := range slots {
		if s >= numSlots {
			return nil, inputErr("slot_mapping[%d] = %d is outside the cache (NB*P = %d)", i, s, numSlots)
		}
	}
	sat, err := in.Params.Bool("fp8_saturate", true)
	if err != nil {
		return nil, asInput(err)
	}
	conv, err := in.Params.Enum("ds_mla_scale", "amax", "amax", "pow2")
	if err != nil {
		return nil, asInput(err)
	}
	mod, err := d.load("kvcache")
	if err != nil {
		return nil, err
	}
	var bufs buffers
	defer bufs.free()
	dkv := bufs.upload(kvc.Data)
	dpe := bufs.upload(kpe.Data)
	dsl := bufs.upload(int64Bytes(slots))
	dc := bufs.upload(before.Data)
	l := launch{mod: mod, grid: [3]int{max(ceilDiv(T, kvWarps), 1), 1, 1}, block: kvWarps * 32}
	switch kind {
	case "bf16":
		l.fn = "kv_cache_write_bf16"
		l.args = args{ptrArg(dkv), ptrArg(dpe), ptrArg(dsl), ptrArg(dc), i32(T), i32(L), i32(R), i64(numSlots)}
	case "fp8_e4m3":
		_, ks, err := scalarF32(in, "k_scale")
		if err != nil {
			return nil, err
		}
		dks := bufs.upload(ks)
		l.fn = "kv_cache_write_fp8"
		l.args = args{ptrArg(dkv), ptrArg(dpe), ptrArg(dsl), ptrArg(dc), ptrArg(dks), i32(T), i32(L), i32(R), i64(numSlots), i32(b2i(sat))}
	default:
		l.fn = "kv_cache_write_ds_mla"
		l.args = args{ptrArg(dkv), ptrArg(dpe), ptrArg(dsl), ptrArg(dc), i32(T), i64(numSlots), i32(b2i(conv == "pow2"))}
	}
	var plan []launch
	if T > 0 {
		plan = append(plan, l)
	}
	res, err := d.finish(&bufs, mod, plan, opt, []outBuf{{"cache_after", dc, before.DType, before.Shape}})
	if err != nil {
		return nil, err
	}
	if kind == "fp8_ds_mla" {
		res.Meta["ds_mla_scale"] = conv
	}
	return res, nil
}

func runKVGather(d *Device, in kernel.Inputs, opt RunOptions) (*Result, error) {
	// A chunked gather (seq_starts) is the plain one over the block table
	// from each request's chunk on (kvcache.Chunked).
	in, err := kvkernels.Chunked(in)
	if err != nil {
		return nil, asInput(err)
	}
	kind, cache, nb, p, dd, err := cacheSpec(in, "cache")
	if err != nil {
		return nil, err
	}
	bt, err := kernel.Need(in, "block_table", indexDTypes...)
	if err != nil {
		return nil, asInput(err)
	}
	sl, err := kernel.Need(in, "seq_lens", indexDTypes...)
	if err != nil {
		return nil, asInput(err)
	}
	if len(bt.Shape) != 2 || len(sl.Shape) != 1 || bt.Shape[0] != sl.Shape[0] {
		return nil, inputErr("tensors block_table %v and seq_lens %v must be [B, max_blocks] and [B]", bt.Shape, sl.Shape)
	}
	B, maxBlocks := bt.Shape[0], bt.Shape[1]
	seq, table, cu, maxSeq, err := pagedTable(bt, sl, nb, p)
	if err != nil {
		return nil, err
	}
	total := int(cu[B])
	od, err := outDType(opt, "gathered", tensor.BF16, tensor.BF16, tensor.F32)
	if err != nil {
		return nil, err
	}
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
	if kind == "fp8_e4m3" {
		_, ks, err := scalarF32(in, "k_scale")
		if err != nil {
			return nil, err
		}
		pk := bufs.upload(ks)
		dks = ptrArg(pk)
	}
	dout := bufs.alloc(int64(total * dd * od.Size()))
	L, R := dd, 0
	fn := map[string]string{"bf16": "kv_cache_gather_bf16", "fp8_e4m3": "kv_cache_gather_fp8", "fp8_ds_mla": "kv_cache_gather_ds_mla"}[kind]
	if kind == "fp8_ds_mla" {
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
			args: args{ptrArg(dc), ptrArg(dbt), ptrArg(dsl), ptrArg(dcu), dks, ptrArg(dout), i32(maxBlocks), i32(p), i32(L), i32(R), i32(nb)}}}
	}
	return d.finish(&bufs, mod, plan, opt, []outBuf{{"gathered", dout, od, []int{total, dd}}})
}

// pagedTable validates a block table and sequence lengths against a cache
// of nb pages of p tokens: every length fits the table and every page a
// request uses is a cache page. It returns the lengths and table as int64
// (for 32-bit upload), the cumulative lengths and the longest length.
func pagedTable(bt, sl *tensor.Tensor, nb, p int) (seq, table, cu []int64, maxSeq int, err error) {
	B, maxBlocks := bt.Shape[0], bt.Shape[1]
	seq, table = indexData(sl), indexData(bt)
	cu = make([]int64, B+1)
	for b := 0; b < B; b++ {
		if seq[b] < 0 || seq[b] > int64(maxBlocks)*int64(p) {
			return nil, nil, nil, 0, inputErr("seq_lens[%d] = %d is outside [0, max_blocks*P = %d]", b, seq[b], maxBlocks*p)
		}
		for j := 0; j < ceilDiv(int(seq[b]), p); j++ {
			if v := table[b*maxBlocks+j]; v < 0 || v >= int64(nb) {
				return nil, nil, nil, 0, inputErr("block_table[%d,%d] = %d is outside the cache (NB = %d)", b, j, v, nb)
			}
		}
		cu[b+1] = cu[b] + seq[b]
		maxSeq = max(maxSeq, int(seq[b]))
	}
	return seq, table, cu, maxSeq, nil
}

// bf16Tokens returns a write's kv_c or k_pe: the contract's other token
// dtypes (F16, F32) are refused as unsupported, the kernel reads bf16.
func bf16Tokens(in kernel.Inputs, name string) (*tensor.Tensor, error) {
	t, err := kernel.Need(in, name, tensor.BF16, tensor.F16, tensor.F32)
	if err != nil {
		return nil, asInput(err)
	}
	if t.DType != tensor.BF16 {
		return nil, unsupported("tensor %s is %s; the CUDA cache writer reads bf16 tokens", name, t.DType)
	}
	return t, nil
}
