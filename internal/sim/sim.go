package sim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/nvfp4"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Config describes the simulated decoder. Zero fields take the defaults
// of DefaultConfig.
type Config struct {
	Preset string `json:"preset"`
	TP     int    `json:"tp"`
	// Prompts run one after another; each frees its pages when it ends, and
	// the next one's requests reuse them.
	Prompts int `json:"prompts"`
	// Steps is the number of decode steps of each prompt.
	Steps int `json:"steps"`
	// Batch is the number of requests decoded together; the kernels see it
	// padded to the next CUDA-graph size (a power of two) with zero hidden
	// states and slot -1, as engines replaying captured graphs do.
	Batch int `json:"batch"`
	// Prefill is the prompt length of request 0; request b's is Prefill+3b,
	// so the requests cross page boundaries at different steps.
	Prefill  int `json:"prefill"`
	PageSize int `json:"page_size"`
	Splits   int `json:"splits"`
	// SQ is the number of query tokens a request decodes per step (2 or
	// more: multi-token prediction, with the bottom-right causal mask).
	SQ           int    `json:"s_q"`
	KVCacheDType string `json:"kv_cache_dtype"`
	ScaleLayout  string `json:"scale_layout"`
	// Hidden is the model width the NVFP4 projection reads (a multiple of
	// 16; its last 16 channels are dead, as pruned or padded channels are).
	Hidden int `json:"hidden"`
	// ActCalib is the static activation calibration (ModelOpt's input_scale)
	// as a multiple of the first prompt's activation amax. 2 leaves
	// headroom; 1e5 models a calibration that saw a massive activation,
	// which pushes decode-time block scales into E4M3's subnormal range.
	ActCalib float64 `json:"act_calib"`
	Seed     uint64  `json:"seed"`
	// Params are added to every kernel's parameters (--set KEY=VALUE).
	Params map[string]string `json:"params,omitempty"`
	// MaxMemory bounds the simulation's estimated working set in bytes
	// (Estimate), as check.Options.MaxMemory bounds a check's: 0 means
	// check.DefaultMaxMemory(), negative means no bound. It is a bound of
	// the machine, not a setting of the simulation, so reports omit it.
	MaxMemory int64 `json:"-"`
}

// DefaultConfig is DeepSeek-V3 at TP8 (16 heads, L = 512, R = 64): three
// prompts of three requests, 12 decode steps each, pages of 16, 8 splits.
func DefaultConfig() Config {
	return Config{Preset: "deepseek-v3", TP: 8, Prompts: 3, Steps: 12, Batch: 3, Prefill: 13, PageSize: 16,
		Splits: 8, SQ: 1, KVCacheDType: "bf16", ScaleLayout: "swizzled_128x4", Hidden: 272, ActCalib: 2, Seed: 1}
}

// withDefaults fills zero fields.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Preset == "" {
		c.Preset = d.Preset
	}
	for _, f := range []struct {
		v   *int
		def int
	}{
		{&c.TP, d.TP}, {&c.Prompts, d.Prompts}, {&c.Steps, d.Steps}, {&c.Batch, d.Batch}, {&c.Prefill, d.Prefill},
		{&c.PageSize, d.PageSize}, {&c.Splits, d.Splits}, {&c.SQ, d.SQ}, {&c.Hidden, d.Hidden},
	} {
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if c.KVCacheDType == "" {
		c.KVCacheDType = d.KVCacheDType
	}
	if c.ScaleLayout == "" {
		c.ScaleLayout = d.ScaleLayout
	}
	if c.ActCalib == 0 {
		c.ActCalib = d.ActCalib
	}
	if c.Seed == 0 {
		c.Seed = d.Seed
	}
	return c
}

// Set applies one setting by its command-line name (the flag without
// dashes: "kv-cache-dtype", "s-q", "set" for KEY=VALUE...). It is how a
// fault's Simulate settings reach the simulation.
func (c *Config) Set(name, value string) error {
	ints := map[string]*int{"tp": &c.TP, "prompts": &c.Prompts, "steps": &c.Steps, "batch": &c.Batch,
		"prefill": &c.Prefill, "page-size": &c.PageSize, "splits": &c.Splits, "s-q": &c.SQ, "hidden": &c.Hidden}
	if p, ok := ints[name]; ok {
		v, err := strconv.Atoi(value)
		if err != nil {
			return fmt.Errorf("--%s %q is not an integer", name, value)
		}
		*p = v
		return nil
	}
	switch name {
	case "preset":
		c.Preset = value
	case "kv-cache-dtype":
		c.KVCacheDType = value
	case "scale-layout":
		c.ScaleLayout = value
	case "act-calib":
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return fmt.Errorf("--act-calib %q is not a number", value)
		}
		c.ActCalib = v
	case "seed":
		v, err := strconv.ParseUint(value, 10, 64)
		if err != nil {
			return fmt.Errorf("--seed %q is not an unsigned integer", value)
		}
		c.Seed = v
	case "set":
		k, v, ok := strings.Cut(value, "=")
		if !ok || k == "" {
			return fmt.Errorf("--set %q: want KEY=VALUE", value)
		}
		if c.Params == nil {
			c.Params = map[string]string{}
		}
		c.Params[k] = v
	default:
		return fmt.Errorf("unknown simulation setting %q", name)
	}
	return nil
}

// Validate reports settings the simulation cannot run.
func (c Config) Validate() error {
	p, err := cases.LookupPreset(c.Preset)
	if err != nil {
		return err
	}
	if _, err := p.HeadsFor(c.TP); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"prompts", c.Prompts}, {"steps", c.Steps}, {"batch", c.Batch}, {"prefill", c.Prefill},
		{"page-size", c.PageSize}, {"splits", c.Splits}, {"s-q", c.SQ}} {
		if f.v < 1 {
			return fmt.Errorf("--%s = %d: want at least 1", f.name, f.v)
		}
	}
	if c.Hidden < 32 || c.Hidden%16 != 0 {
		return fmt.Errorf("--hidden = %d: want a multiple of 16, at least 32", c.Hidden)
	}
	switch c.KVCacheDType {
	case "bf16", "fp8_e4m3", "fp8_ds_mla":
	default:
		return fmt.Errorf("--kv-cache-dtype %q: want bf16, fp8_e4m3 or fp8_ds_mla", c.KVCacheDType)
	}
	switch c.ScaleLayout {
	case "linear", "swizzled_128x4":
	default:
		return fmt.Errorf("--scale-layout %q: want linear or swizzled_128x4", c.ScaleLayout)
	}
	if !(c.ActCalib > 0) || math.IsInf(c.ActCalib, 0) {
		return fmt.Errorf("--act-calib %v: want a positive number", c.ActCalib)
	}
	return nil
}

// String is the configuration in command-line form, for reports.
func (c Config) String() string {
	s := fmt.Sprintf("--preset %s --tp %d --prompts %d --steps %d --batch %d --prefill %d --page-size %d --splits %d --s-q %d --kv-cache-dtype %s --scale-layout %s --hidden %d --act-calib %g --seed %d",
		c.Preset, c.TP, c.Prompts, c.Steps, c.Batch, c.Prefill, c.PageSize, c.Splits, c.SQ, c.KVCacheDType, c.ScaleLayout, c.Hidden, c.ActCalib, c.Seed)
	keys := make([]string, 0, len(c.Params))
	for k := range c.Params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		s += fmt.Sprintf(" --set %s=%s", k, c.Params[k])
	}
	return s
}

// Sim is one MLA attention layer of a decoder, small enough to run on a
// CPU, with the geometry of a real preset:
//
//	load:  W_UK (NVFP4 checkpoint)  --nvfp4_dequantize-->  bf16, for the absorption
//	h (token embedding, bf16)  --nvfp4_quantize + nvfp4_gemm (W_in, NVFP4)-->  [q_nope | q_pe] per head, kv_c, k_pe
//	q = [q_nope·W_UK | q_pe] (absorbed, D = L + R); kv_c RMS-normalized
//	kv_c, k_pe  --kv_cache_write-->  paged cache
//	q  --mla_decode (split-K partials)-->  --splitk_combine-->  o [H, L]
//	h_out = RMSNorm(h + W_o o), next token = argmax(U h_out)   (glue)
//
// W_in fuses the query projection with the kv projection, as DeepSeek's
// fused q_a/kv_a projection does; it and W_UK are quantized once, like a
// ModelOpt checkpoint, with the reference quantizer. W_UK is dequantized at
// load by the backend, as vLLM dequantizes kv_b_proj to absorb it.
// Activations are quantized every step by the backend with a static global
// scale. The glue (the split of the projection, the absorption product,
// the norms, W_o, the output head) is plain float64 rounded to bf16 where
// an engine stores bf16, identical in every run, so runs differ only where
// the kernels do.
type Sim struct {
	cfg            Config
	heads, l, r, d int
	nope           int                       // qk_nope_head_dim: the query width W_UK absorbs
	n              int                       // projection width H·(nope + R) + L + R
	wuk            map[string]*tensor.Tensor // W_UK [H·nope, L] as the checkpoint stores it
	scale          float64
	graphBatch     int
	win            map[string]*tensor.Tensor // b_packed, b_scale, b_global
	wo             []float64                 // [Hidden, H·L]
	actGS, kScale  float64
	emb, unemb     []float64 // [Vocab, Hidden]: token embeddings and the output head
	prompt, first  [][]int   // per prompt: the prompt tokens (request-major) and each request's first SQ tokens
	live           int       // live hidden channels (the rest are dead)
	nb, maxBlocks  int
	lens           []int // prefill length of each request
}

// New builds the simulated decoder: weights, inputs and static scales,
// all from cfg.Seed.
func New(cfg Config) (*Sim, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e, err := Estimate(cfg)
	if err != nil {
		return nil, err
	}
	if err := check.CheckMemory(e, cfg.MaxMemory, "the simulation"); err != nil {
		return nil, err
	}
	p, _ := cases.LookupPreset(cfg.Preset)
	s := &Sim{cfg: cfg, l: p.Latent, r: p.Rope, scale: p.SoftmaxScale}
	s.heads, _ = p.HeadsFor(cfg.TP)
	s.d = s.l + s.r
	s.nope = 128 // DeepSeek-V3 and Kimi-K2
	if p.Name == "glm-5" {
		s.nope = 192
	}
	s.n = s.heads*(s.nope+s.r) + s.l + s.r
	s.graphBatch = 1
	for s.graphBatch < cfg.Batch {
		s.graphBatch *= 2
	}
	s.live = cfg.Hidden - 16
	rng := newRNG(cfg.Seed)

	// W_in: query rows with std 1/sqrt(live), kv rows twice that (so a
	// fused GEMM's two halves have different ranges, as real shards do).
	win := make([]float64, s.n*cfg.Hidden)
	for row := 0; row < s.n; row++ {
		std := 1 / math.Sqrt(float64(s.live))
		if row >= s.heads*(s.nope+s.r) {
			std *= 2
		}
		for c := 0; c < s.live; c++ {
			win[row*cfg.Hidden+c] = formats.RoundBF16(rng.normal() * std)
		}
	}
	if s.win, err = quantizeWeights(win, s.n, cfg.Hidden, cfg.ScaleLayout); err != nil {
		return nil, err
	}
	// W_UK: [H·nope, L], so that q_nope·W_UK has a standard deviation
	// near qGain (scores with a standard deviation near 1.6: attention
	// spread over many tokens, so cache errors show).
	wuk := make([]float64, s.heads*s.nope*s.l)
	for i := range wuk {
		wuk[i] = formats.RoundBF16(rng.normal() * qGain / math.Sqrt(float64(s.nope)))
	}
	if s.wuk, err = quantizeWeights(wuk, s.heads*s.nope, s.l, cfg.ScaleLayout); err != nil {
		return nil, err
	}
	// W_o: [Hidden, H·L], dead rows zero.
	s.wo = make([]float64, cfg.Hidden*s.heads*s.l)
	for row := 0; row < s.live; row++ {
		std := 1 / math.Sqrt(float64(s.heads*s.l))
		for c := 0; c < s.heads*s.l; c++ {
			s.wo[row*s.heads*s.l+c] = rng.normal() * std
		}
	}
	// Inputs: per prompt, the prompt tokens' hidden states and each
	// request's first decode hidden states (s_q of them).
	s.lens = make([]int, cfg.Batch)
	total := 0
	for b := range s.lens {
		s.lens[b] = cfg.Prefill + 3*b
		total += s.lens[b]
	}
	s.emb = s.hiddens(rng, Vocab)
	s.unemb = make([]float64, Vocab*cfg.Hidden)
	for i := range s.unemb {
		if i%cfg.Hidden < s.live {
			s.unemb[i] = rng.normal()
		}
	}
	for p := 0; p < cfg.Prompts; p++ {
		s.prompt = append(s.prompt, rng.tokens(total))
		s.first = append(s.first, rng.tokens(cfg.Batch*cfg.SQ))
	}
	// Static scales: the activation global scale from the first prompt's
	// amax (times ActCalib), the fp8 k_scale from its projected kv (x1.25).
	prefill0 := s.embed(s.prompt[0])
	amax := 0.0
	for _, v := range prefill0 {
		amax = math.Max(amax, math.Abs(v))
	}
	s.actGS = float64(float32(448 * 6 / (amax * cfg.ActCalib)))
	kvAmax := 0.0
	for i := 0; i < total; i++ {
		kvc, kpe := s.kvOf(exactRow(win, prefill0[i*cfg.Hidden:(i+1)*cfg.Hidden], s.n, cfg.Hidden))
		for _, v := range append(kvc, kpe...) {
			kvAmax = math.Max(kvAmax, math.Abs(v))
		}
	}
	s.kScale = float64(float32(1.25 * kvAmax / 448))
	// Pages: every request of a prompt holds its context for the whole
	// prompt; one spare block, so the allocator's order matters.
	for _, n := range s.lens {
		pages := (n + cfg.Steps*cfg.SQ + cfg.PageSize - 1) / cfg.PageSize
		s.nb += pages
		s.maxBlocks = max(s.maxBlocks, pages)
	}
	s.nb++
	return s, nil
}

// Config returns the configuration with defaults filled in.
func (s *Sim) Config() Config { return s.cfg }

// Heads returns the query heads the simulation runs (after TP).
func (s *Sim) Heads() int { return s.heads }

// hiddens draws rows of RMS-normalized hidden states (dead channels 0).
func (s *Sim) hiddens(rng *simRNG, rows int) []float64 {
	h := make([]float64, rows*s.cfg.Hidden)
	for r := 0; r < rows; r++ {
		row := h[r*s.cfg.Hidden : (r+1)*s.cfg.Hidden]
		for c := 0; c < s.live; c++ {
			row[c] = rng.normal()
		}
		rmsNorm(row)
		for c := range row {
			row[c] = formats.RoundBF16(row[c])
		}
	}
	return h
}

func rmsNorm(x []float64) {
	ss := 0.0
	for _, v := range x {
		ss += v * v
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+1e-6)
	for i := range x {
		x[i] *= inv
	}
}

// exactRow is W·h in float64 (for the static k_scale only).
func exactRow(w, h []float64, n, k int) []float64 {
	y := make([]float64, n)
	for i := range y {
		acc := 0.0
		for j, v := range h {
			acc += w[i*k+j] * v
		}
		y[i] = acc
	}
	return y
}

// kvOf splits one projected row's kv part: kv_c RMS-normalized (DeepSeek's
// kv_a_layernorm), k_pe as projected, both rounded to bf16.
func (s *Sim) kvOf(y []float64) (kvc, kpe []float64) {
	off := s.heads * (s.nope + s.r)
	kvc = append([]float64(nil), y[off:off+s.l]...)
	rmsNorm(kvc)
	kpe = append([]float64(nil), y[off+s.l:off+s.l+s.r]...)
	for i := range kvc {
		kvc[i] = formats.RoundBF16(kvc[i])
	}
	for i := range kpe {
		kpe[i] = formats.RoundBF16(kpe[i])
	}
	return kvc, kpe
}

// qGain is the standard deviation of the absorbed query's elements (the
// rope part is scaled to match).
const qGain = 0.5

// quantizeWeights quantizes W [n, k] offline, as a checkpoint's weight,
// weight_scale and dequant-direction weight_scale_2: the reference
// quantizer's fp32-arithmetic answer (what ModelOpt's export computes).
func quantizeWeights(w []float64, n, k int, layout string) (map[string]*tensor.Tensor, error) {
	amax := 0.0
	for _, v := range w {
		amax = math.Max(amax, math.Abs(v))
	}
	gs := float64(float32(448 * 6 / amax))
	q, err := nvfp4.QuantizeExpectedCodes(context.Background(), w, n, k, gs)
	if err != nil {
		return nil, fmt.Errorf("quantizing W_in: %v", err)
	}
	kSF := k / nvfp4.BlockSize
	sc := &tensor.Tensor{DType: tensor.F8E4M3, Shape: []int{n, kSF}, Data: q.Scales}
	if lay, err := nvfp4.ParseLayout(layout); err != nil {
		return nil, err
	} else if lay != nvfp4.Linear {
		st, err := lay.FromLinear(q.Scales, n, kSF)
		if err != nil {
			return nil, err
		}
		mPad, kPad := lay.PaddedShape(n, kSF)
		sc = &tensor.Tensor{DType: tensor.F8E4M3, Shape: []int{mPad, kPad}, Data: st}
	}
	return map[string]*tensor.Tensor{
		"b_packed": {DType: tensor.U8, Shape: []int{n, k / 2}, Data: q.Packed()},
		"b_scale":  sc, "b_global": scalar(1 / gs),
	}, nil
}

func scalar(v float64) *tensor.Tensor { return tensor.FromFloat64s(tensor.F32, []int{}, []float64{v}) }

// Step is what one decode step of one run produced.
type Step struct {
	Prompt, Step int
	// ContextLen is the longest context in the batch after the step's
	// tokens were written.
	ContextLen int
	// Out is the attention output (splitk_combine's out), [Batch·SQ·H, L].
	Out []float64
	// Hidden are the step's input hidden states, [Batch·SQ, Hidden].
	Hidden []float64
	// Next are the tokens the step chose, the next step's inputs.
	Next []int
}

// Trace is a run's steps, in order (prompt-major).
type Trace []Step

// allocator is a paged KV allocator with a LIFO free list: the most
// recently freed block is reused first, so a new sequence lands on pages an
// earlier one has just left (and, at start, on the highest block ids).
type allocator struct{ free []int }

func newAllocator(nb int) *allocator {
	a := &allocator{}
	for b := 0; b < nb; b++ {
		a.free = append(a.free, b)
	}
	return a
}

func (a *allocator) alloc() (int, error) {
	if len(a.free) == 0 {
		return 0, fmt.Errorf("the simulated cache ran out of blocks")
	}
	b := a.free[len(a.free)-1]
	a.free = a.free[:len(a.free)-1]
	return b, nil
}

func (a *allocator) release(blocks []int) { a.free = append(a.free, blocks...) }

// runner is one run's state.
type runner struct {
	s     *Sim
	be    backend.Backend
	ctx   context.Context
	cache *tensor.Tensor
	wuk   []float64 // W_UK as the backend dequantized it, [H·nope, L]
}

// load dequantizes W_UK on the backend, as an engine does once at load.
func (r *runner) load() error {
	s := r.s
	ts := map[string]*tensor.Tensor{"packed": s.wuk["b_packed"], "block_scale": s.wuk["b_scale"], "global_scale": s.wuk["b_global"]}
	out, err := r.call("nvfp4_dequantize", ts, s.params(map[string]string{"scale_layout": s.cfg.ScaleLayout, "global_scale_kind": "dequant"}))
	if err != nil {
		return fmt.Errorf("loading W_UK: %w", err)
	}
	w, ok := out["out"]
	if !ok || w.Len() != s.heads*s.nope*s.l {
		return fmt.Errorf("nvfp4_dequantize on %s returned no out [%d, %d]", r.be.Name(), s.heads*s.nope, s.l)
	}
	r.wuk = w.Float64s()
	return nil
}

// absorb makes one query token's absorbed q [H, D] from its projected row:
// q_latent = q_nope·W_UK per head, then q_pe (times qGain), in bf16.
func (r *runner) absorb(y, q []float64) {
	s := r.s
	L, D, w := s.l, s.d, s.nope+s.r
	for h := 0; h < s.heads; h++ {
		qn := y[h*w : h*w+s.nope]
		lat := make([]float64, L)
		for d, v := range qn {
			row := r.wuk[(h*s.nope+d)*L : (h*s.nope+d+1)*L]
			for j, u := range row {
				lat[j] += v * u
			}
		}
		for j := 0; j < L; j++ {
			q[h*D+j] = formats.RoundBF16(lat[j])
		}
		for j := 0; j < s.r; j++ {
			q[h*D+L+j] = formats.RoundBF16(y[h*w+s.nope+j] * qGain)
		}
	}
}

func (s *Sim) params(extra map[string]string) kernel.Params {
	p := kernel.Params{}
	for k, v := range s.cfg.Params {
		p[k] = v
	}
	for k, v := range extra {
		p[k] = v
	}
	return p
}

// call runs kernel name on the backend. Every kernel of the simulation
// goes through here, so this is where an interrupt or the deadline stops
// it (the in-process backends do not watch the context themselves).
func (r *runner) call(name string, ts map[string]*tensor.Tensor, p kernel.Params) (map[string]*tensor.Tensor, error) {
	if err := r.ctx.Err(); err != nil {
		return nil, fmt.Errorf("stopped before %s: %w", name, err)
	}
	out, err := r.be.Run(r.ctx, name, kernel.Inputs{Tensors: ts, Params: p})
	if err != nil {
		return nil, fmt.Errorf("%s on %s: %w", name, r.be.Name(), err)
	}
	return out, nil
}

// project runs the NVFP4 projection of hidden rows [m, Hidden] and returns
// the projected rows [m, n] (bf16 values).
func (r *runner) project(h []float64, m int) ([]float64, error) {
	s := r.s
	x := tensor.FromFloat64s(tensor.BF16, []int{m, s.cfg.Hidden}, h)
	q, err := r.call("nvfp4_quantize", map[string]*tensor.Tensor{"x": x, "global_scale": scalar(s.actGS)},
		s.params(map[string]string{"scale_layout": s.cfg.ScaleLayout}))
	if err != nil {
		return nil, err
	}
	ts := map[string]*tensor.Tensor{"a_packed": q["packed"], "a_scale": q["block_scale"], "a_global": scalar(s.actGS)}
	for k, v := range s.win {
		ts[k] = v
	}
	g, err := r.call("nvfp4_gemm", ts, s.params(map[string]string{"scale_layout": s.cfg.ScaleLayout,
		"a_global_kind": "quant", "b_global_kind": "dequant"}))
	if err != nil {
		return nil, err
	}
	out, ok := g["out"]
	if !ok || out.Len() != m*s.n {
		return nil, fmt.Errorf("nvfp4_gemm on %s returned no out [%d, %d]", r.be.Name(), m, s.n)
	}
	return out.Float64s(), nil
}

// cacheTensor allocates the zeroed cache (vLLM allocates with torch.zeros).
func (s *Sim) cacheTensor() *tensor.Tensor {
	switch s.cfg.KVCacheDType {
	case "fp8_e4m3":
		return tensor.New(tensor.U8, s.nb, s.cfg.PageSize, s.d)
	case "fp8_ds_mla":
		return tensor.New(tensor.U8, s.nb, s.cfg.PageSize, 656)
	}
	return tensor.New(tensor.BF16, s.nb, s.cfg.PageSize, s.d)
}

// write appends tokens to the cache. kv rows are [T, ...]; req and pos say
// whose token each is (req < 0: a padded token, slot -1).
func (r *runner) write(kvc, kpe []float64, req, pos []int, table []int64) error {
	s := r.s
	T := len(req)
	slots := make([]int64, T)
	bi := make([]int64, T)
	ps := make([]int64, T)
	for i := range req {
		slots[i], bi[i], ps[i] = -1, int64(req[i]), int64(pos[i])
		if req[i] >= 0 {
			blk := table[req[i]*s.maxBlocks+pos[i]/s.cfg.PageSize]
			slots[i] = blk*int64(s.cfg.PageSize) + int64(pos[i]%s.cfg.PageSize)
		}
	}
	ts := map[string]*tensor.Tensor{
		"kv_c":         tensor.FromFloat64s(tensor.BF16, []int{T, s.l}, kvc),
		"k_pe":         tensor.FromFloat64s(tensor.BF16, []int{T, s.r}, kpe),
		"slot_mapping": tensor.FromInt64s(tensor.I64, []int{T}, slots),
		"cache_before": r.cache,
		// What a page-table-driven writer (FlashInfer's append) reads.
		"engine.block_table":   tensor.FromInt64s(tensor.I32, []int{s.cfg.Batch, s.maxBlocks}, table),
		"engine.batch_indices": tensor.FromInt64s(tensor.I32, []int{T}, bi),
		"engine.positions":     tensor.FromInt64s(tensor.I32, []int{T}, ps),
	}
	if s.cfg.KVCacheDType == "fp8_e4m3" {
		ts["k_scale"] = scalar(s.kScale)
	}
	out, err := r.call("kv_cache_write", ts, s.params(map[string]string{"kv_cache_dtype": s.cfg.KVCacheDType,
		"page_size": strconv.Itoa(s.cfg.PageSize)}))
	if err != nil {
		return err
	}
	c, ok := out["cache_after"]
	if !ok || len(c.Data) != len(r.cache.Data) {
		return fmt.Errorf("kv_cache_write on %s returned no cache_after of the cache's size", r.be.Name())
	}
	r.cache = c
	return nil
}

// Run runs the whole simulation on be, choosing its own tokens. On an
// error it returns the steps it completed with the error.
func (s *Sim) Run(ctx context.Context, be backend.Backend) (Trace, error) {
	return s.run(ctx, be, nil, -1)
}

// RunForced runs the simulation on be with every step's input hidden
// states taken from forced, a reference run (teacher forcing): the
// reference's output is what is fed forward, and be's kernels run side by
// side with it on the same inputs, each run keeping its own KV cache. An
// error then stays where a kernel makes it or where it sits in the cache,
// instead of compounding through the 4-bit activations: left free, two
// correct chains drift apart by whole FP4 codes within a few steps (a
// rounding-sized difference in o shifts a hidden state across a code
// boundary) and the floor grows to several percent.
func (s *Sim) RunForced(ctx context.Context, be backend.Backend, forced Trace) (Trace, error) {
	return s.run(ctx, be, forced, -1)
}

// run stops after limit decode steps (limit < 0: none). A run stopped
// early is the prefix of the full run: every step depends only on the
// steps before it.
func (s *Sim) run(ctx context.Context, be backend.Backend, forced Trace, limit int) (Trace, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	r := &runner{s: s, be: be, ctx: ctx, cache: s.cacheTensor()}
	if err := r.load(); err != nil {
		return nil, err
	}
	alloc := newAllocator(s.nb)
	cfg := s.cfg
	var trace Trace
	for p := 0; p < cfg.Prompts && (limit < 0 || len(trace) < limit); p++ {
		// Allocate every request's pages for the whole prompt.
		table := make([]int64, cfg.Batch*s.maxBlocks) // unused entries stay 0, as engines pad
		var owned []int
		for b, n := range s.lens {
			pages := (n + cfg.Steps*cfg.SQ + cfg.PageSize - 1) / cfg.PageSize
			for j := 0; j < pages; j++ {
				blk, err := alloc.alloc()
				if err != nil {
					return trace, err
				}
				table[b*s.maxBlocks+j] = int64(blk)
				owned = append(owned, blk)
			}
		}
		// Prefill: the prompt's tokens go through the projection and into
		// the cache (prefill attention is not simulated).
		total := len(s.prompt[p])
		y, err := r.project(s.embed(s.prompt[p]), total)
		if err != nil {
			return trace, fmt.Errorf("prompt %d prefill: %w", p, err)
		}
		var kvcs, kpes []float64
		var req, pos []int
		row := 0
		for b, n := range s.lens {
			for t := 0; t < n; t++ {
				kvc, kpe := s.kvOf(y[row*s.n : (row+1)*s.n])
				kvcs, kpes = append(kvcs, kvc...), append(kpes, kpe...)
				req, pos = append(req, b), append(pos, t)
				row++
			}
		}
		if err := r.write(kvcs, kpes, req, pos, table); err != nil {
			return trace, fmt.Errorf("prompt %d prefill: %w", p, err)
		}
		ctxLen := append([]int(nil), s.lens...)
		tokens := s.first[p]
		var prev []float64
		for t := 0; t < cfg.Steps && (limit < 0 || len(trace) < limit); t++ {
			h := s.hidden(tokens, prev)
			if i := len(trace); i < len(forced) {
				h = forced[i].Hidden
			}
			st, err := r.step(h, ctxLen, table)
			if err != nil {
				return trace, fmt.Errorf("prompt %d step %d: %w", p, t, err)
			}
			st.Prompt, st.Step = p, t
			trace = append(trace, st)
			tokens, prev = st.Next, st.Out
		}
		// The prompt ends: its pages go back, most recent last.
		alloc.release(owned)
	}
	return trace, nil
}

// step runs one decode step for every request: project, write the SQ new
// tokens, attend with split-K, combine, and feed the output forward.
func (r *runner) step(h []float64, ctxLen []int, table []int64) (Step, error) {
	s := r.s
	cfg := s.cfg
	B, SQ, H, L, D := cfg.Batch, cfg.SQ, s.heads, s.l, s.d
	rows := s.graphBatch * SQ
	x := make([]float64, rows*cfg.Hidden) // padded rows stay zero
	copy(x, h)
	y, err := r.project(x, rows)
	if err != nil {
		return Step{}, err
	}
	q := make([]float64, B*SQ*H*D)
	var kvcs, kpes []float64
	req, pos := make([]int, rows), make([]int, rows)
	for i := 0; i < rows; i++ {
		kvc, kpe := s.kvOf(y[i*s.n : (i+1)*s.n])
		kvcs, kpes = append(kvcs, kvc...), append(kpes, kpe...)
		b, j := i/SQ, i%SQ
		req[i], pos[i] = -1, 0
		if b < B {
			req[i], pos[i] = b, ctxLen[b]+j
			r.absorb(y[i*s.n:(i+1)*s.n], q[i*H*D:(i+1)*H*D])
		}
	}
	if err := r.write(kvcs, kpes, req, pos, table); err != nil {
		return Step{}, err
	}
	longest := 0
	lens := make([]int64, B)
	for b := range ctxLen {
		ctxLen[b] += SQ
		lens[b] = int64(ctxLen[b])
		longest = max(longest, ctxLen[b])
	}
	ts := map[string]*tensor.Tensor{
		"q":           tensor.FromFloat64s(tensor.BF16, []int{B, SQ, H, D}, q),
		"kv_cache":    r.cache,
		"block_table": tensor.FromInt64s(tensor.I32, []int{B, s.maxBlocks}, table),
		"seq_lens":    tensor.FromInt64s(tensor.I32, []int{B}, lens),
	}
	if cfg.KVCacheDType == "fp8_e4m3" {
		ts["k_scale"] = scalar(s.kScale)
	}
	mp := map[string]string{"softmax_scale": strconv.FormatFloat(s.scale, 'g', -1, 64), "kv_cache_dtype": cfg.KVCacheDType,
		"page_size": strconv.Itoa(cfg.PageSize), "num_splits": strconv.Itoa(cfg.Splits)}
	if SQ > 1 {
		mp["causal"] = "true"
	}
	att, err := r.call("mla_decode", ts, s.params(mp))
	if err != nil {
		return Step{}, err
	}
	po, pl := att["partial_out"], att["partial_lse"]
	N := B * SQ * H
	if po == nil || pl == nil || po.Len() != N*cfg.Splits*L || pl.Len() != N*cfg.Splits {
		return Step{}, fmt.Errorf("mla_decode on %s returned no split-K partials [%d, %d, %d]", r.be.Name(), N, cfg.Splits, L)
	}
	comb, err := r.call("splitk_combine", map[string]*tensor.Tensor{
		"partial_out": &tensor.Tensor{DType: po.DType, Shape: []int{N, cfg.Splits, L}, Data: po.Data},
		"partial_lse": &tensor.Tensor{DType: pl.DType, Shape: []int{N, cfg.Splits}, Data: pl.Data},
	}, s.params(nil))
	if err != nil {
		return Step{}, err
	}
	o, ok := comb["out"]
	if !ok || o.Len() != N*L {
		return Step{}, fmt.Errorf("splitk_combine on %s returned no out [%d, %d]", r.be.Name(), N, L)
	}
	out := o.Float64s()
	return Step{ContextLen: longest, Out: out, Hidden: h, Next: s.nextTokens(h, out)}, nil
}

// Vocab is the simulated vocabulary. The output reaches the next step two
// ways. As a token, as in a real decoder: h_out = RMSNorm(h + W_o o), the
// next token is the argmax of the output head's logits, and its embedding
// starts the next hidden state. And as a residual: the next hidden state is
// RMSNorm(embedding + Feedback·W_o o), so the output moves the next query
// and the next token's kv_c and k_pe through the NVFP4 projection.
const Vocab = 64

// Feedback is the weight of the previous attention output in the next
// hidden state.
const Feedback = 0.25

// hidden makes the step's input hidden states: the tokens' embeddings
// plus Feedback·W_o·prev (prev nil on a prompt's first step), RMS-
// normalized and rounded to bf16.
func (s *Sim) hidden(tokens []int, prev []float64) []float64 {
	h := s.embed(tokens)
	if prev == nil {
		return h
	}
	hid, hl := s.cfg.Hidden, s.heads*s.l
	for i := range tokens {
		row := h[i*hid : (i+1)*hid]
		oi := prev[i*hl : (i+1)*hl]
		for c := 0; c < s.live; c++ {
			w := s.wo[c*hl : (c+1)*hl]
			acc := 0.0
			for j, v := range oi {
				acc += w[j] * v
			}
			row[c] += Feedback * acc
		}
		rmsNorm(row)
		for c := range row {
			row[c] = formats.RoundBF16(row[c])
		}
	}
	return h
}

// nextTokens picks each query's next token (ties and NaN logits: the
// lowest index).
func (s *Sim) nextTokens(h, out []float64) []int {
	hid, hl := s.cfg.Hidden, s.heads*s.l
	rows := len(out) / hl
	next := make([]int, rows)
	row := make([]float64, hid)
	for i := 0; i < rows; i++ {
		oi := out[i*hl : (i+1)*hl]
		for c := range row {
			row[c] = h[i*hid+c]
		}
		for c := 0; c < s.live; c++ {
			w := s.wo[c*hl : (c+1)*hl]
			acc := 0.0
			for j, v := range oi {
				acc += w[j] * v
			}
			row[c] += acc
		}
		rmsNorm(row)
		best, bestV := 0, math.Inf(-1)
		for v := 0; v < Vocab; v++ {
			u := s.unemb[v*hid : (v+1)*hid]
			logit := 0.0
			for c, x := range row {
				logit += u[c] * x
			}
			if logit > bestV {
				best, bestV = v, logit
			}
		}
		next[i] = best
	}
	return next
}

// embed returns the embeddings of tokens, [len(tokens), Hidden].
func (s *Sim) embed(tokens []int) []float64 {
	hid := s.cfg.Hidden
	h := make([]float64, len(tokens)*hid)
	for i, t := range tokens {
		copy(h[i*hid:(i+1)*hid], s.emb[t*hid:(t+1)*hid])
	}
	return h
}

// simRNG is a seeded normal generator whose sequence is fixed by its own
// code (PCG, Box-Muller), so simulations replay under any Go release.
type simRNG struct {
	src   *rand.PCG
	spare float64
	has   bool
}

func newRNG(seed uint64) *simRNG { return &simRNG{src: rand.NewPCG(seed, 0x6b636865636b)} }

// tokens draws n tokens uniformly from the vocabulary.
func (r *simRNG) tokens(n int) []int {
	t := make([]int, n)
	for i := range t {
		t[i] = int(r.src.Uint64() % Vocab)
	}
	return t
}

func (r *simRNG) normal() float64 {
	if r.has {
		r.has = false
		return r.spare
	}
	u1 := float64(r.src.Uint64()>>11) * 0x1p-53
	for u1 == 0 {
		u1 = float64(r.src.Uint64()>>11) * 0x1p-53
	}
	u2 := float64(r.src.Uint64()>>11) * 0x1p-53
	rad := math.Sqrt(-2 * math.Log(u1))
	r.spare, r.has = rad*math.Sin(2*math.Pi*u2), true
	return rad * math.Cos(2*math.Pi*u2)
}
