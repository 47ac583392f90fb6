// Package paged holds what the kernels that read a paged KV cache share
// (kv_cache_write and kv_cache_gather, mla_decode, dsa_indexer): the
// cache and index dtypes, the cache layout read from the parameters, the
// k_scale input and which cache entries a batch reads.
package paged

import (
	"fmt"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

var (
	CacheDTypes = []tensor.DType{tensor.BF16, tensor.F16, tensor.U8, tensor.F8E4M3}
	IndexDTypes = []tensor.DType{tensor.I32, tensor.I64}
)

// ReadsNothing is the Read of an input whose values the kernel never reads
// as numbers: a writer's cache_before, whose entries it either overwrites
// or leaves byte for byte as they were.
func ReadsNothing(Inputs) (func(int) bool, error) { return func(int) bool { return false }, nil }

// AttendedRows is the Read of a paged cache [NB, P, entry]: the entries of
// token t < seq_lens[b] of every request b, at block_table[b, t/P], t%P.
func AttendedRows(cache string) func(Inputs) (func(int) bool, error) {
	return func(in Inputs) (func(int) bool, error) {
		read, err := AttendedEntries(in, cache)
		if err != nil {
			return nil, err
		}
		return RowsRead(read, in.Tensors[cache].Shape[2]), nil
	}
}

// AttendedEntries marks the entries (block·P + offset) of cache [NB, P, ...]
// that the tokens of block_table and seq_lens occupy.
func AttendedEntries(in Inputs, cache string) ([]bool, error) {
	ct, bt, sl := in.Tensors[cache], in.Tensors["block_table"], in.Tensors["seq_lens"]
	if ct == nil || bt == nil || sl == nil || len(ct.Shape) != 3 {
		return nil, fmt.Errorf("tensors %s, block_table or seq_lens missing or misshapen", cache)
	}
	pages, err := kvcache.NewPages(bt, sl, ct.Shape[1], ct.Shape[0])
	if err != nil {
		return nil, err
	}
	read := make([]bool, ct.Shape[0]*ct.Shape[1])
	for b, n := range pages.SeqLens {
		for t := 0; t < n; t++ {
			blk, off := pages.Locate(b, t)
			read[blk*ct.Shape[1]+off] = true
		}
	}
	return read, nil
}

// RowsRead turns a set of cache entries (rows of width elements) into a
// Read.
func RowsRead(rows []bool, width int) func(int) bool {
	return func(i int) bool { r := i / max(width, 1); return r < len(rows) && rows[r] }
}

// Auto is the kv_cache_dtype that means the cache tensor's own dtype, as
// vLLM's --kv-cache-dtype auto means the model's (reference/CONTRACTS.md
// §3.4): bf16 for a BF16 cache, fp16 for an F16 one, never an assumed one.
const Auto = "auto"

// CacheKinds are the kv_cache_dtype values a capture may state: the
// layouts and auto.
var CacheKinds = append(append([]string(nil), kvcache.Kinds...), Auto)

// CacheKind reads kv_cache_dtype for the cache tensor called name: auto is
// resolved from the tensor's dtype, and a cache auto cannot name (bytes) is
// an error that says which layouts store bytes.
func CacheKind(p Params, name string, cache *tensor.Tensor) (kvcache.Kind, error) {
	kind, err := p.Enum("kv_cache_dtype", string(kvcache.BF16), CacheKinds...)
	if err != nil {
		return "", err
	}
	if kind != Auto {
		return kvcache.Kind(kind), nil
	}
	switch cache.DType {
	case tensor.BF16:
		return kvcache.BF16, nil
	case tensor.F16:
		return kvcache.FP16, nil
	}
	return "", fmt.Errorf("parameter kv_cache_dtype = auto means the cache's own dtype (BF16 or F16), but tensor %s is %s: "+
		"an fp8 cache needs kv_cache_dtype fp8_e4m3 or fp8_ds_mla (vLLM resolves auto to fp8_e4m3 for a ModelOpt checkpoint whose kv_cache_quant_algo is FP8)", name, cache.DType)
}

// CacheLayout reads kv_cache_dtype, page_size and ds_mla_scale for a cache
// tensor; page_size defaults to the cache's second dimension, ds_mla_scale
// to the layout's writer's (kvcache.DefaultScale: pow2 for
// fp8_ds_mla_model1, whose E8M0 scales hold nothing else). l and r are the
// latent and rope widths (the DeepSeek layouts' are fixed).
func CacheLayout(p Params, prec Precision, name string, cache *tensor.Tensor, l, r int) (kvcache.Layout, error) {
	kind, err := CacheKind(p, name, cache)
	if err != nil {
		return kvcache.Layout{}, err
	}
	conv, err := p.Enum("ds_mla_scale", string(kvcache.DefaultScale(kind)), kvcache.ScaleConventions...)
	if err != nil {
		return kvcache.Layout{}, err
	}
	if len(cache.Shape) != 3 {
		return kvcache.Layout{}, fmt.Errorf("tensor %s has shape %v; the contract wants [NB, P, entry]", name, cache.Shape)
	}
	ps, err := p.Int("page_size", cache.Shape[1])
	if err != nil {
		return kvcache.Layout{}, err
	}
	switch kind {
	case kvcache.FP8DSMLA:
		l, r = kvcache.DSLatent, kvcache.DSRope
	case kvcache.FP8DSMLAModel1, kvcache.FP8DSMLAV41:
		l, r = kvcache.M1Nope, kvcache.M1Rope
	}
	lay := kvcache.Layout{Kind: kvcache.Kind(kind), L: l, R: r, PageSize: ps,
		DSScale: kvcache.ScaleConvention(conv), Saturate: prec.FP8Saturate}
	return lay, lay.Validate()
}

// RefuseV4 is the error of a reader that does not take DeepSeek-V4's
// caches (fp8_ds_mla_model1, fp8_ds_mla_v41): of the attention kernels only
// FlashMLA's sparse decode reads them (deepseek-ai/FlashMLA@9241ae3
// csrc/api/sparse_decode.h:288-298; its dense decode takes no FP8 cache,
// csrc/api/dense_decode.h:35), and vLLM's V4 gather
// (dequantize_and_gather_k_cache, vllm 0.33.0
// vllm/models/deepseek_v4/common/ops/cache_utils.py:499,
// deepseek_v41/common/ops/cache_utils.py:764) is a Triton function with
// its own arguments, not gather_and_maybe_dequant_cache, so
// kv_cache_gather's contract has no engine call over them yet. nil for
// every other layout.
func RefuseV4(kernel string, lay kvcache.Layout) error {
	if !lay.Kind.V4() {
		return nil
	}
	return fmt.Errorf("kernel %s does not read kv_cache_dtype %s (a DeepSeek-V4 sparse cache): of the readers only mla_decode_sparse does, as only FlashMLA's sparse decode reads that layout", kernel, lay.Kind)
}

// KScale returns k_scale when the layout has one (an error naming it when it
// is missing or unusable), else 0.
func KScale(in Inputs, lay kvcache.Layout) (float64, error) {
	if !lay.NeedsKScale() {
		return 0, nil
	}
	t, err := Need(in, "k_scale", tensor.F32)
	if err != nil {
		return 0, fmt.Errorf("%v (kv_cache_dtype %s divides by it)", err, lay.Kind)
	}
	v, err := t.Scalar()
	if err != nil {
		return 0, fmt.Errorf("tensor k_scale: %v", err)
	}
	return v, kvcache.CheckKScale(v)
}

// AsDType views t's bytes as dtype d (U8 and F8_E4M3 caches are the same
// bytes), when the layout allows d.
func AsDType(name string, t *tensor.Tensor, d tensor.DType, lay kvcache.Layout) (*tensor.Tensor, error) {
	if d == "" || d == t.DType {
		return t, nil
	}
	for _, ok := range lay.CacheDTypes() {
		if ok == d && d.Size() == t.DType.Size() {
			return &tensor.Tensor{DType: d, Shape: t.Shape, Data: t.Data}, nil
		}
	}
	return nil, fmt.Errorf("tensor %s has dtype %s but the cache it is written over is %s (kv_cache_dtype %s)", name, d, t.DType, lay.Kind)
}

// The parameters of a paged cache, the same for every kernel that reads
// one.
var (
	PageSizeParam = ParamSpec{Name: "page_size", Kind: ParamInt,
		Doc: "tokens a cache block holds; when given it must equal the cache's second dimension, its default"}
	CacheDTypeParam = ParamSpec{Name: "kv_cache_dtype", Kind: ParamEnum, Default: string(kvcache.BF16), Allowed: CacheKinds,
		Doc: "the cache's layout: bf16 or fp16 entries, fp8_e4m3 entries over k_scale, DeepSeek-V3.2's fp8_ds_mla (656-byte entries, 512 + 64) or DeepSeek-V4's fp8_ds_mla_model1 (584-byte block-split entries, 448 + 64) or V4.1's fp8_ds_mla_v41 (528-byte MXFP8 entries; both kv_cache_write and mla_decode_sparse only); auto is the cache tensor's own dtype (BF16 or F16)"}
	DSMLAScaleParam = ParamSpec{Name: "ds_mla_scale", Kind: ParamEnum, Default: string(kvcache.ScaleAmax), Allowed: kvcache.ScaleConventions,
		Doc: "how a DeepSeek cache entry's tile scales are chosen from the tile's amax: amax, pow2 (FlashMLA's tests) or pow2_amax_floor (vLLM's V4 writer); the default is amax for fp8_ds_mla, pow2 for fp8_ds_mla_model1 and pow2_amax_floor for fp8_ds_mla_v41"}
)

// CacheGeometry returns the block count, page size and entry width (values
// a row, or bytes for fp8_ds_mla) of a cache tensor name [NB, P, entry],
// the page size read from the page_size parameter (default P): what the
// planted faults of every paged kernel (the cache writes, the decodes, the
// transfer) address a cache by.
func CacheGeometry(t *tensor.Tensor, p Params, name string) (nb, page, entry int, err error) {
	if len(t.Shape) != 3 {
		return 0, 0, 0, fmt.Errorf("tensor %s has shape %v; want [NB, P, entry]", name, t.Shape)
	}
	page, err = p.Int("page_size", t.Shape[1])
	if err != nil {
		return 0, 0, 0, err
	}
	if page <= 0 {
		return 0, 0, 0, fmt.Errorf("parameter page_size = %d: want a positive page size", page)
	}
	return t.Shape[0], page, t.Shape[2], nil
}

// EntryBytes is the byte size of one cache entry of t [NB, P, entry].
func EntryBytes(t *tensor.Tensor) int { return t.Shape[2] * t.DType.Size() }
