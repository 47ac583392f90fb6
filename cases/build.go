package cases

import (
	"context"
	"fmt"
	"math"
	"strconv"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Validate checks what can be checked without building tensors.
func (c Case) Validate() error {
	if _, err := kernel.Lookup(c.Kernel); err != nil {
		return err
	}
	if c.Preset != "" {
		p, err := LookupPreset(c.Preset)
		if err != nil {
			return err
		}
		if c.TP > 0 {
			if _, err := p.HeadsFor(c.TP); err != nil {
				return err
			}
		}
	}
	for i, s := range c.SeqLens {
		if s < 0 {
			return fmt.Errorf("seq_lens[%d] = %d is negative", i, s)
		}
	}
	if c.PageSize < 0 || c.Batch < 0 || c.SQ < 0 || c.Splits < 0 || c.M < 0 || c.N < 0 || c.K < 0 {
		return fmt.Errorf("negative size")
	}
	if c.K%16 != 0 {
		return fmt.Errorf("k = %d is not a multiple of 16", c.K)
	}
	return nil
}

// geometry resolves the attention shape of a case with defaults.
type geometry struct {
	heads, latent, rope, batch, sq, page, splits int
	seqLens                                      []int
	scale                                        float64
	cacheDType                                   string
	preset                                       Preset
}

// sizes is the geometry without seqLens, the one part a few bytes of a case
// file can make any size ("batch": 2^40): what the metadata and the memory
// estimate read, neither of which may allocate per request.
func (c Case) sizes() (geometry, error) {
	g := geometry{batch: c.Batch, sq: c.SQ, page: c.PageSize, splits: c.Splits, cacheDType: c.KVCacheDType}
	presetName := c.Preset
	if presetName == "" {
		presetName = "deepseek-v3"
	}
	p, err := LookupPreset(presetName)
	if err != nil {
		return g, err
	}
	g.preset = p
	tp := c.TP
	if tp == 0 {
		tp = 1
	}
	if g.heads, err = p.HeadsFor(tp); err != nil {
		return g, err
	}
	if c.Heads > 0 {
		g.heads = c.Heads
	}
	g.latent, g.rope = p.Latent, p.Rope
	if c.Latent > 0 {
		g.latent = c.Latent
	}
	if c.Rope > 0 {
		g.rope = c.Rope
	}
	g.scale = p.SoftmaxScale
	if g.sq == 0 {
		g.sq = 1
	}
	if g.page == 0 {
		g.page = 64
	}
	if g.cacheDType == "" {
		g.cacheDType = "bf16"
	}
	switch {
	case len(c.SeqLens) > 0:
		g.batch = len(c.SeqLens)
	case g.batch == 0:
		g.batch = 2
	}
	return g, nil
}

// geometry is sizes with every request's seq_len: the generators call it
// once the case's memory estimate has been accepted.
func (c Case) geometry() (geometry, error) {
	g, err := c.sizes()
	if err != nil {
		return g, err
	}
	g.seqLens = c.SeqLens
	if len(g.seqLens) == 0 {
		g.seqLens = make([]int, g.batch)
		for i := range g.seqLens {
			g.seqLens[i] = 4*g.page + 1 + i // past a page boundary, requests differ (check.EstimateCase mirrors it)
		}
	}
	return g, nil
}

// Metadata returns the capture metadata of the case: kernel, parameters
// and the case's own name and seed for provenance.
func (c Case) Metadata() (map[string]string, error) {
	m := map[string]string{
		"kcheck.format": "1",
		"kcheck.kernel": c.Kernel,
		"kcheck.case":   c.Name,
		"kcheck.seed":   strconv.FormatUint(c.Seed, 10),
	}
	switch c.Kernel {
	case "mla_decode", "mla_decode_sparse", "kv_cache_write", "kv_cache_gather", "dsa_indexer":
		g, err := c.sizes()
		if err != nil {
			return nil, err
		}
		m["page_size"] = strconv.Itoa(g.page)
		if c.Kernel != "dsa_indexer" {
			m["kv_cache_dtype"] = g.cacheDType
		}
		if c.Kernel == "mla_decode" || c.Kernel == "mla_decode_sparse" {
			m["softmax_scale"] = strconv.FormatFloat(g.scale, 'g', -1, 64)
			if g.sq > 1 {
				m["causal"] = "true"
			}
			if g.splits > 0 && c.Kernel == "mla_decode" {
				m["num_splits"] = strconv.Itoa(g.splits)
			}
		}
	}
	if c.Kernel == "dsa_indexer" || c.Kernel == "mla_decode_sparse" {
		m["topk"] = strconv.Itoa(c.topK())
	}
	for k, v := range c.Params {
		m[k] = v
	}
	return m, nil
}

func (c Case) topK() int {
	if c.TopK > 0 {
		return c.TopK
	}
	if p, ok := Presets[c.Preset]; ok && p.TopK > 0 {
		return p.TopK
	}
	return 64
}

// Inputs builds the case's input tensors, deterministically from its seed.
func (c Case) Inputs() (kernel.Inputs, error) { return c.InputsContext(context.Background()) }

// InputsContext is Inputs stopped when ctx is done: the generator runs the
// references (the quantizer, the cache writer) on its own tensors, whose
// size a case sets.
func (c Case) InputsContext(ctx context.Context) (kernel.Inputs, error) {
	meta, err := c.Metadata()
	if err != nil {
		return kernel.Inputs{}, err
	}
	params := kernel.Params{}
	for k, v := range meta {
		params[k] = v
	}
	b := builder{ctx: ctx, c: c, r: newRNG(c.Seed, 1), params: params}
	var ts map[string]*tensor.Tensor
	switch c.Kernel {
	case "nvfp4_quantize":
		ts, err = b.nvfp4Quantize()
	case "nvfp4_dequantize":
		ts, err = b.nvfp4Dequantize()
	case "nvfp4_gemm":
		ts, err = b.nvfp4GEMM()
	case "kv_cache_write":
		ts, err = b.kvWrite()
	case "kv_cache_gather":
		ts, err = b.kvGather()
	case "mla_decode", "mla_decode_sparse":
		ts, err = b.mlaDecode(c.Kernel == "mla_decode_sparse")
	case "splitk_combine":
		ts, err = b.splitkCombine()
	case "dsa_indexer":
		ts, err = b.dsaIndexer()
	default:
		err = fmt.Errorf("case %s: no input generator for kernel %s", c.Name, c.Kernel)
	}
	if err != nil {
		return kernel.Inputs{}, fmt.Errorf("case %s: %v", c.Name, err)
	}
	return kernel.Inputs{Tensors: ts, Params: params}, nil
}

type builder struct {
	ctx    context.Context
	c      Case
	r      *rng
	params kernel.Params
}

// activations returns bf16-representable values like a layer's: normal
// with a few outlier channels (the reason per-block scales exist).
func (b *builder) activations(n, cols int) []float64 {
	v := make([]float64, n)
	for i := range v {
		x := b.r.normal()
		if (i%cols)%97 == 13 {
			x *= 20 // an outlier channel
		}
		v[i] = formats.RoundBF16(x)
	}
	return v
}

func bf16(shape []int, v []float64) *tensor.Tensor { return tensor.FromFloat64s(tensor.BF16, shape, v) }

func f32Scalar(v float64) *tensor.Tensor {
	return tensor.FromFloat64s(tensor.F32, []int{}, []float64{v})
}

func amax(v []float64) float64 {
	m := 0.0
	for _, x := range v {
		m = math.Max(m, math.Abs(x))
	}
	return m
}

func (b *builder) nvfp4Shape() (m, k int) {
	m, k = b.c.M, b.c.K
	if m == 0 {
		m = 32
	}
	if k == 0 {
		k = 256
	}
	return m, k
}

// quantized runs the registered nvfp4_quantize reference on x to make
// packed codes and block scales the way an engine would.
func (b *builder) quantized(x []float64, rows, k int, layout string) (packed, scale *tensor.Tensor, gs float64, err error) {
	q, err := kernel.Lookup("nvfp4_quantize")
	if err != nil {
		return nil, nil, 0, err
	}
	gs = 448 * 6 / amax(x)
	out, err := kernel.Produce(b.ctx, q, kernel.Inputs{
		Tensors: map[string]*tensor.Tensor{"x": bf16([]int{rows, k}, x), "global_scale": f32Scalar(gs)},
		Params:  kernel.Params{"scale_layout": layout},
	}, kernel.DefaultPrecision(), nil)
	if err != nil {
		return nil, nil, 0, err
	}
	return out["packed"], out["block_scale"], float64(float32(gs)), nil
}

func (b *builder) layout() string { return b.params.String("scale_layout", "linear") }

func (b *builder) nvfp4Quantize() (map[string]*tensor.Tensor, error) {
	m, k := b.nvfp4Shape()
	x := b.activations(m*k, k)
	return map[string]*tensor.Tensor{"x": bf16([]int{m, k}, x), "global_scale": f32Scalar(448 * 6 / amax(x))}, nil
}

// globalFor expresses a quant-direction global scale gs in the direction
// the case declares.
func globalFor(gs float64, kind string) float64 {
	if kind == "quant" {
		return gs
	}
	return 1 / gs
}

func (b *builder) nvfp4Dequantize() (map[string]*tensor.Tensor, error) {
	m, k := b.nvfp4Shape()
	x := b.activations(m*k, k)
	packed, scale, gs, err := b.quantized(x, m, k, b.layout())
	if err != nil {
		return nil, err
	}
	return map[string]*tensor.Tensor{"packed": packed, "block_scale": scale,
		"global_scale": f32Scalar(globalFor(gs, b.params.String("global_scale_kind", "dequant")))}, nil
}

func (b *builder) nvfp4GEMM() (map[string]*tensor.Tensor, error) {
	m, k := b.nvfp4Shape()
	n := b.c.N
	if n == 0 {
		n = 64
	}
	a := b.activations(m*k, k)
	w := make([]float64, n*k)
	for i := range w {
		w[i] = formats.RoundBF16(b.r.normal() * 0.02) // init-like weights
	}
	ap, as, ags, err := b.quantized(a, m, k, b.layout())
	if err != nil {
		return nil, err
	}
	bp, bs, bgs, err := b.quantized(w, n, k, b.layout())
	if err != nil {
		return nil, err
	}
	return map[string]*tensor.Tensor{
		"a_packed": ap, "a_scale": as, "a_global": f32Scalar(globalFor(ags, b.params.String("a_global_kind", "dequant"))),
		"b_packed": bp, "b_scale": bs, "b_global": f32Scalar(globalFor(bgs, b.params.String("b_global_kind", "dequant"))),
	}, nil
}
