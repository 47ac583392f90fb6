package paged

import (
	"context"
	"fmt"
	"math"
	"strconv"

	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/kvcache"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// What the generators of the paged kernels share: a shuffled block
// allocation, caches filled through the one writer the checker trusts, and
// the memory a case of them needs before it is built.

// Paging is a block allocation for a batch: a shuffled block table (so a
// kernel that assumes contiguous pages fails) and two spare blocks that no
// request owns (poisoned, so a kernel that reads past its pages sees NaN, as
// FlashMLA's tests poison unused pages).
type Paging struct {
	NB, MaxBlocks int
	Table         []int64 // [B, MaxBlocks]
}

// NewPaging allocates the pages of seqLens.
func NewPaging(r *RNG, seqLens []int, page int) Paging {
	used, maxBlocks := 0, 1
	for _, s := range seqLens {
		n := (s + page - 1) / page
		used += n
		maxBlocks = max(maxBlocks, n)
	}
	p := Paging{NB: used + 2, MaxBlocks: maxBlocks, Table: make([]int64, len(seqLens)*maxBlocks)}
	order := r.Perm(p.NB)
	next := 0
	for req, s := range seqLens {
		for j := 0; j < (s+page-1)/page; j++ {
			p.Table[req*maxBlocks+j] = int64(order[next])
			next++
		}
	}
	return p
}

// Slot is token t of request req's global cache slot, block*P + offset.
func (p Paging) Slot(req, t, page int) int64 {
	return p.Table[req*p.MaxBlocks+t/page]*int64(page) + int64(t%page)
}

// entryWidth is the last dimension of a cache of kv_cache_dtype.
func entryWidth(cacheDType string, d int) int {
	switch kvcache.Kind(cacheDType) {
	case kvcache.FP8DSMLA:
		return kvcache.DSEntryBytes
	case kvcache.FP8DSMLAModel1:
		return kvcache.M1EntryBytes
	case kvcache.FP8DSMLAV41:
		return kvcache.V41EntryBytes
	}
	return d
}

// EmptyCache returns a cache of nb blocks filled with fill: "poison"
// (NaN in every field) or "random" (earlier content a write must keep),
// or ctx's error once it is done.
func EmptyCache(ctx context.Context, r *RNG, cacheDType string, nb, page, d int, fill string) (*tensor.Tensor, error) {
	var t *tensor.Tensor
	switch cacheDType {
	case "bf16":
		t = tensor.New(tensor.BF16, nb, page, d)
	case "fp16":
		t = tensor.New(tensor.F16, nb, page, d)
	case "fp8_e4m3", "fp8_ds_mla", "fp8_ds_mla_model1", "fp8_ds_mla_v41":
		t = tensor.New(tensor.U8, nb, page, entryWidth(cacheDType, d))
	default:
		return nil, fmt.Errorf("kv_cache_dtype %q: want bf16, fp16, fp8_e4m3, fp8_ds_mla, fp8_ds_mla_model1 or fp8_ds_mla_v41", cacheDType)
	}
	// A stride at a time, as Stopped looks: a test of fill, a string, and
	// of ctx an element were a third of a catalog cache's making.
	poison := fill == "poison"
	for lo := 0; lo < len(t.Data); lo += StopStride {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		b := t.Data[lo:min(lo+StopStride, len(t.Data))]
		if poison {
			for i := range b {
				b[i] = 0xFF // bf16 and fp16 0xFFFF, e4m3 0xFF, f32 0xFFFFFFFF: NaN in every field
			}
			continue
		}
		for i := range b {
			b[i] = byte(r.Uint64())
		}
	}
	if !poison && (t.DType == tensor.BF16 || t.DType == tensor.F16) {
		v := make([]float64, min(StopStride, t.Len()))
		for lo := 0; lo < t.Len(); lo += StopStride {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			v = v[:min(StopStride, t.Len()-lo)]
			r.Normals(v)
			for k, x := range v {
				t.SetFloat64(lo+k, x)
			}
		}
	}
	return t, nil
}

// Tokens returns bf16 kv_c [T, L] and k_pe [T, R] values, or ctx's error
// once it is done.
func Tokens(ctx context.Context, r *RNG, n, l, rope int) (kvc, kpe []float64, err error) {
	kvc, kpe = make([]float64, n*l), make([]float64, n*rope)
	for _, v := range [][]float64{kvc, kpe} {
		if err := Normals(ctx, r, v); err != nil {
			return nil, nil, err
		}
		for i, x := range v {
			v[i] = formats.RoundBF16(x)
		}
	}
	return kvc, kpe, nil
}

// ModelDType is the dtype of a case's activations (q, kv_c, k_pe) for its
// cache dtype: an fp16 cache is an fp16 model's, every other one a bf16
// model's (an fp8 cache is dequantized to bf16).
func ModelDType(cacheDType string) tensor.DType {
	if cacheDType == "fp16" {
		return tensor.F16
	}
	return tensor.BF16
}

// HasKScale reports whether a case of cacheDType carries a k_scale input:
// every fp8 one (fp8_ds_mla's is ignored, as its cases always held one).
func HasKScale(cacheDType string) bool { return cacheDType != "bf16" && cacheDType != "fp16" }

// writeCache stores tokens at slots through the registered kv_cache_write
// reference, so every layout is produced by the one writer the checker trusts.
func writeCache(ctx context.Context, before *tensor.Tensor, kvc, kpe []float64, l, r int, slots []int64, params Params, kScale float64) (*tensor.Tensor, error) {
	w, err := Lookup("kv_cache_write")
	if err != nil {
		return nil, err
	}
	n := len(slots)
	cacheDType := params.String("kv_cache_dtype", "bf16")
	md := ModelDType(cacheDType)
	in := map[string]*tensor.Tensor{
		"kv_c": tensor.FromFloat64s(md, []int{n, l}, kvc), "k_pe": tensor.FromFloat64s(md, []int{n, r}, kpe),
		"slot_mapping": tensor.FromInt64s(tensor.I64, []int{n}, slots), "cache_before": before,
	}
	if HasKScale(cacheDType) {
		in["k_scale"] = F32Scalar(kScale)
	}
	out, err := Produce(ctx, w, Inputs{Tensors: in, Params: params}, DefaultPrecision(), nil)
	if err != nil {
		return nil, err
	}
	return out["cache_after"], nil
}

// KScaleOf is the fp8 k_scale of tokens kvc and kpe: their amax over 448.
func KScaleOf(kvc, kpe []float64) float64 {
	m := math.Max(AbsMax(kvc), AbsMax(kpe))
	if m == 0 {
		return 1
	}
	return float64(float32(m / 448))
}

// Cache builds a filled paged cache for g's requests seqLens; params are
// the case's (ds_mla_scale and fp8_saturate reach the writer). Under a
// kernel.Memo (a run of many cases) a cache built before from the same RNG
// state, geometry and writer parameters is copied instead, and r is left
// where the build would leave it.
func Cache(ctx context.Context, r *RNG, g Geometry, seqLens []int, params Params) (*tensor.Tensor, Paging, float64, error) {
	memo := MemoFrom(ctx)
	if memo == nil {
		return buildCache(ctx, r, g, seqLens, params)
	}
	wp := writerParams(g, params)
	key := fmt.Sprintf("paged.Cache %x L=%d R=%d %v %v", r.State(), g.Latent, g.Rope, seqLens, wp)
	if v, ok := memo.Get(key); ok {
		b := v.(*builtCache)
		if err := r.Restore(b.rngAfter); err != nil {
			return nil, Paging{}, 0, err
		}
		return b.cache.Clone(), b.pg.clone(), b.kScale, nil
	}
	cache, pg, kScale, err := buildCache(ctx, r, g, seqLens, params)
	if err != nil {
		return nil, pg, 0, err
	}
	// a cache too large to keep is not copied to be dropped
	if size := int64(len(cache.Data) + 8*len(pg.Table)); memo.Keeps(size) {
		memo.Put(key, &builtCache{cache.Clone(), pg.clone(), kScale, r.State()}, size)
	}
	return cache, pg, kScale, nil
}

// builtCache is what Cache keeps in a memo: its results and the RNG's
// state after the build.
type builtCache struct {
	cache    *tensor.Tensor
	pg       Paging
	kScale   float64
	rngAfter []byte
}

func (p Paging) clone() Paging {
	p.Table = append([]int64(nil), p.Table...)
	return p
}

// writerParams are the parameters of the kv_cache_write that fills a cache
// of g: its dtype and page size, and the case's ds_mla_scale and
// fp8_saturate.
func writerParams(g Geometry, params Params) Params {
	wp := Params{"kv_cache_dtype": g.KVCacheDType, "page_size": fmt.Sprint(g.PageSize)}
	for k, v := range params {
		if k == "ds_mla_scale" || k == "fp8_saturate" {
			wp[k] = v
		}
	}
	return wp
}

// buildCache is Cache without the memo.
func buildCache(ctx context.Context, r *RNG, g Geometry, seqLens []int, params Params) (cache *tensor.Tensor, pg Paging, kScale float64, err error) {
	d := g.Latent + g.Rope
	pg = NewPaging(r, seqLens, g.PageSize)
	before, err := EmptyCache(ctx, r, g.KVCacheDType, pg.NB, g.PageSize, d, "poison")
	if err != nil {
		return nil, pg, 0, err
	}
	var slots []int64
	for req, s := range seqLens {
		for t := 0; t < s; t++ {
			slots = append(slots, pg.Slot(req, t, g.PageSize))
		}
	}
	kvc, kpe, err := Tokens(ctx, r, len(slots), g.Latent, g.Rope)
	if err != nil {
		return nil, pg, 0, err
	}
	kScale = KScaleOf(kvc, kpe)
	cache, err = writeCache(ctx, before, kvc, kpe, g.Latent, g.Rope, slots, writerParams(g, params), kScale)
	return cache, pg, kScale, err
}

// Tables returns block_table and seq_lens for seqLens over pg.
func Tables(seqLens []int, pg Paging) map[string]*tensor.Tensor {
	sl := make([]int64, len(seqLens))
	for i, s := range seqLens {
		sl[i] = int64(s)
	}
	return map[string]*tensor.Tensor{
		"block_table": tensor.FromInt64s(tensor.I32, []int{len(seqLens), pg.MaxBlocks}, pg.Table),
		"seq_lens":    tensor.FromInt64s(tensor.I32, []int{len(seqLens)}, sl),
	}
}

// Defaults are the parameters every paged case states: its page size and,
// unless withDType is false (the indexer's cache is bf16 only), its cache
// dtype.
func Defaults(c Case, withDType bool) Params {
	p := Params{"page_size": strconv.Itoa(c.Geometry.PageSize)}
	if withDType {
		p["kv_cache_dtype"] = c.Geometry.KVCacheDType
	}
	return p
}

// PlanCost adds what every paged generator holds (every token's values
// drawn in float64 and written through the cache reference, the block
// table) and returns the shapes so far (block_table, seq_lens) with the
// number of cache blocks and the D = L + R of an entry.
func PlanCost(c Case, cost *Cost) (s Shapes, blocks, d int64) {
	g := c.Geometry
	s = NewShapes()
	d = int64(g.Latent + g.Rope)
	page := int64(g.PageSize)
	blocks, maxBlocks := g.SeqLens.Blocks(page)
	tokens, _ := g.SeqLens.Tokens(Saturated)
	blocks = AddSizes(blocks, 2)
	maxBlocks = max(maxBlocks, 1)
	s.SeqLens = g.SeqLens
	b := g.SeqLens.Count()
	cost.Input("generated tokens", []int64{tokens, d}, 40)
	cost.Input("cache", []int64{blocks, page, AddSizes(d, 80)}, 2*4)
	cost.Input("block_table", []int64{b, maxBlocks}, 16)
	s.Dims["block_table"] = []int64{b, maxBlocks}
	s.Dims["seq_lens"] = []int64{b}
	return s, blocks, d
}
