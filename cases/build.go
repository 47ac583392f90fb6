package cases

import (
	"context"
	"fmt"
	"strconv"

	"github.com/kcheck-dev/kcheck/internal/kernel"
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

// Sizes is c as its kernel's generator reads it, for the memory estimate,
// which must not fail: the preset's geometry where the case names a
// readable one (DeepSeek-V3's otherwise: the case's own validation reports
// an unknown preset or tp), the case's overrides and the shared defaults.
// Nothing is allocated per request: a case file's batch can be 2^40. Its
// Params are the case's metadata parameters (none when its metadata
// cannot be made).
func (c Case) Sizes() kernel.Case {
	g := kernel.Geometry{Heads: 128, Latent: 512, Rope: 64, SQ: c.SQ, PageSize: c.PageSize, Splits: c.Splits, KVCacheDType: c.KVCacheDType}
	name := c.Preset
	if name == "" {
		name = "deepseek-v3"
	}
	if p, err := LookupPreset(name); err == nil {
		g.Heads, g.Latent, g.Rope, g.SoftmaxScale = p.Heads, p.Latent, p.Rope, p.SoftmaxScale
		if h, err := p.HeadsFor(max(c.TP, 1)); err == nil {
			g.Heads = h
		}
	}
	kc := c.resolve(g)
	kc.Params = kernel.Params{}
	if meta, err := c.Metadata(); err == nil {
		for k, v := range meta {
			kc.Params[k] = v
		}
	}
	return kc
}

// kernelCase is c as its kernel's generator reads it: an unknown preset,
// or a tp that does not divide its heads, is an error.
func (c Case) kernelCase() (kernel.Case, error) {
	name := c.Preset
	if name == "" {
		name = "deepseek-v3"
	}
	p, err := LookupPreset(name)
	if err != nil {
		return kernel.Case{}, err
	}
	tp := c.TP
	if tp == 0 {
		tp = 1
	}
	heads, err := p.HeadsFor(tp)
	if err != nil {
		return kernel.Case{}, err
	}
	return c.resolve(kernel.Geometry{Heads: heads, Latent: p.Latent, Rope: p.Rope, SoftmaxScale: p.SoftmaxScale,
		SQ: c.SQ, PageSize: c.PageSize, Splits: c.Splits, KVCacheDType: c.KVCacheDType}), nil
}

// resolve applies the case's overrides and the defaults every attention
// case shares to g, the preset's geometry.
func (c Case) resolve(g kernel.Geometry) kernel.Case {
	if c.Heads > 0 {
		g.Heads = c.Heads
	}
	if c.Latent > 0 {
		g.Latent = c.Latent
	}
	if c.Rope > 0 {
		g.Rope = c.Rope
	}
	g.SQ = max(g.SQ, 1)
	if g.PageSize <= 0 {
		g.PageSize = 64
	}
	if g.KVCacheDType == "" {
		g.KVCacheDType = "bf16"
	}
	g.TopK = c.topK()
	switch {
	case len(c.SeqLens) > 0:
		g.Batch = len(c.SeqLens)
		g.SeqLens.List = make([]int64, len(c.SeqLens))
		for i, n := range c.SeqLens {
			g.SeqLens.List[i] = int64(n)
		}
	default:
		g.Batch = c.Batch
		if g.Batch <= 0 {
			g.Batch = 2
		}
		// past a page boundary, requests differ
		g.SeqLens = kernel.Contexts{First: int64(4*g.PageSize + 1), N: int64(g.Batch)}
	}
	return kernel.Case{Name: c.Name, Kernel: c.Kernel, Seed: c.Seed,
		M: c.M, N: c.N, K: c.K, Heads: c.Heads, Splits: c.Splits, TopK: c.TopK, Geometry: g}
}

// generator is the Generator of c's kernel.
func (c Case) generator() (kernel.Generator, error) {
	k, err := kernel.Lookup(c.Kernel)
	if err != nil {
		return nil, err
	}
	return k.(kernel.Generator), nil
}

// Metadata returns the capture metadata of the case: kernel, parameters
// (the kernel's defaults for the case, then the case's own) and the case's
// own name and seed for provenance.
func (c Case) Metadata() (map[string]string, error) {
	gen, err := c.generator()
	if err != nil {
		return nil, err
	}
	kc, err := c.kernelCase()
	if err != nil {
		return nil, err
	}
	m := map[string]string{
		"kcheck.format": "1",
		"kcheck.kernel": c.Kernel,
		"kcheck.case":   c.Name,
		"kcheck.seed":   strconv.FormatUint(c.Seed, 10),
	}
	for k, v := range gen.Defaults(kc) {
		m[k] = v
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
	gen, err := c.generator()
	if err != nil {
		return kernel.Inputs{}, err
	}
	kc, err := c.kernelCase()
	if err != nil {
		return kernel.Inputs{}, err
	}
	kc.Params = params
	ts, err := gen.Generate(ctx, kc, kernel.NewRNG(c.Seed, 1))
	if err != nil {
		return kernel.Inputs{}, fmt.Errorf("case %s: %w", c.Name, err)
	}
	return kernel.Inputs{Tensors: ts, Params: params}, nil
}
