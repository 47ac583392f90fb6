// Package shrink makes a failing configuration small enough to attach to a
// bug report while it still fails the same way.
//
// A case is shrunk by greedy delta debugging over its fields: drop
// requests, shorten contexts (by halves, by a page, by a token), halve the
// heads, the split count, s_q, top-k, the latent width and the GEMM's M, N
// and K, and keep each change whose result still fails with the same
// signature. A capture of an engine's own tensors cannot be re-run at
// another size, but attention, GEMM, quantization and combine outputs
// decompose over requests, heads and rows, so a capture is shrunk by
// keeping a subset of those (and of the cache blocks the kept requests
// use), checked against the captured outputs themselves.
//
// "The same signature" is the fingerprint of the first failing output: its
// tensor name and the pattern (and coordinate) signature.Analyze names.
package shrink

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"sort"
	"strings"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
)

// Fingerprint identifies how a capture fails.
type Fingerprint struct {
	Verdict compare.Verdict `json:"verdict"`
	// Tensor is the first failing output (contract order).
	Tensor  string `json:"tensor,omitempty"`
	Pattern string `json:"pattern,omitempty"`
	Coord   string `json:"coord,omitempty"`
}

func (f Fingerprint) String() string {
	if f.Tensor == "" {
		return string(f.Verdict)
	}
	s := fmt.Sprintf("%s on %s, %s", f.Verdict, f.Tensor, f.Pattern)
	if f.Coord != "" {
		s += " (" + f.Coord + ")"
	}
	return s
}

// FingerprintOf reads a check result's fingerprint.
func FingerprintOf(r check.Result) Fingerprint {
	fp := Fingerprint{Verdict: r.Verdict}
	for _, c := range r.Checks {
		if c.Verdict == compare.Fail {
			fp.Tensor = c.Tensor
			if c.Signature != nil {
				fp.Pattern, fp.Coord = c.Signature.Pattern, c.Signature.Coord
			}
			break
		}
	}
	return fp
}

// Result is a shrink's outcome.
type Result struct {
	Fingerprint Fingerprint `json:"fingerprint"`
	// Before and After are the evidence sizes in bytes (every tensor).
	Before, After int64 `json:"-"`
	BeforeBytes   int64 `json:"before_bytes"`
	AfterBytes    int64 `json:"after_bytes"`
	// Tries counts the candidate configurations checked.
	Tries int `json:"tries"`
	// Steps describes each accepted reduction, in order.
	Steps []string `json:"steps"`
	// Case is the shrunk case (case shrinking only).
	Case *cases.Case `json:"case,omitempty"`
	// Capture is the shrunk evidence.
	Capture evidence.Capture `json:"-"`
	// Check is the shrunk evidence's check.
	Check check.Result `json:"check"`
}

// Options tune a shrink.
type Options struct {
	Check check.Options
	// MaxTries bounds the candidates checked (default 300).
	MaxTries int
}

func (o Options) maxTries() int {
	if o.MaxTries > 0 {
		return o.MaxTries
	}
	return 300
}

// Size is the bytes of a capture's tensors.
func Size(c evidence.Capture) int64 {
	var n int64
	for _, t := range c.Tensors {
		n += int64(len(t.Data))
	}
	return n
}

// Run builds a case's inputs, runs the kernel on be, and returns the
// capture (inputs and outputs) with the case's metadata, the backend and
// the case itself (as JSON) for reproduction.
func Run(ctx context.Context, c cases.Case, be backend.Backend) (evidence.Capture, error) {
	capt, err := backend.RunCase(ctx, be, c)
	if err != nil {
		return evidence.Capture{}, err
	}
	cj, _ := json.Marshal(c)
	capt.Metadata["kcheck.case_json"] = string(cj)
	return capt, nil
}

// Case shrinks a case that fails on be.
func Case(ctx context.Context, c cases.Case, be backend.Backend, opts Options) (*Result, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	// Refused before anything is built, as kcheck run refuses it.
	if err := check.CheckCaseMemory(c.Sizes(), opts.Check.MaxMemory); err != nil {
		return nil, err
	}
	c = materialize(c)
	cap0, err := Run(ctx, c, be)
	if err != nil {
		return nil, err
	}
	res0 := check.Run(ctx, cap0, opts.Check)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	want := FingerprintOf(res0)
	if want.Verdict != check.Fail {
		return nil, fmt.Errorf("case %s does not fail on %s (verdict %s): nothing to shrink", c.Name, be.Name(), res0.Verdict)
	}
	r := &Result{Fingerprint: want, Before: Size(cap0), Capture: cap0, Check: res0}
	cur := c
	for progress := true; progress && r.Tries < opts.maxTries(); {
		progress = false
		for _, cand := range candidates(cur) {
			if r.Tries >= opts.maxTries() {
				break
			}
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if cand.c.Validate() != nil {
				continue
			}
			r.Tries++
			capt, err := Run(ctx, cand.c, be)
			if err != nil {
				continue // a configuration the backend cannot run is not smaller evidence
			}
			if Size(capt) >= Size(r.Capture) {
				continue
			}
			res := check.Run(ctx, capt, opts.Check)
			if FingerprintOf(res) != want {
				continue
			}
			cur, r.Capture, r.Check = cand.c, capt, res
			r.Steps = append(r.Steps, cand.what)
			progress = true
			break
		}
	}
	r.After = Size(r.Capture)
	r.BeforeBytes, r.AfterBytes = r.Before, r.After
	cur.Name = c.Name + "/shrunk"
	r.Case = &cur
	r.Capture.Name = cur.Name
	r.Capture.Metadata["kcheck.case"] = cur.Name
	r.Capture.Metadata["kcheck.shrunk_from"] = c.Name
	cj, _ := json.Marshal(cur)
	r.Capture.Metadata["kcheck.case_json"] = string(cj)
	return r, nil
}

// sizesOf is what c's kernel reads of a case (none for an unknown kernel:
// the case is refused before it runs).
func sizesOf(c cases.Case) kernel.CaseSizes {
	k, err := kernel.Lookup(c.Kernel)
	if err != nil {
		return kernel.CaseSizes{}
	}
	return k.(kernel.Slicer).CaseSizes()
}

// materialize makes a case's implicit sizes explicit (the generator's
// defaults), so that shrinking can reduce them.
func materialize(c cases.Case) cases.Case {
	c.SeqLens = append([]int(nil), c.SeqLens...)
	c.Params = copyParams(c.Params)
	sz := sizesOf(c)
	if sz.SeqLens {
		if len(c.SeqLens) == 0 {
			if in, err := c.Inputs(); err == nil {
				if sl, ok := in.Tensors["seq_lens"]; ok {
					for i := 0; i < sl.Len(); i++ {
						c.SeqLens = append(c.SeqLens, int(sl.Int64At(i)))
					}
				}
			}
		}
		if c.PageSize == 0 {
			c.PageSize = sz.PageSize
		}
	}
	for _, f := range []struct {
		v   *int
		def int
	}{{&c.M, sz.M}, {&c.K, sz.K}, {&c.N, sz.N}} {
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if c.Preset != "" && c.Heads == 0 {
		if p, err := cases.LookupPreset(c.Preset); err == nil {
			tp := max(c.TP, 1)
			if h, err := p.HeadsFor(tp); err == nil {
				c.Heads = h
			}
		}
	}
	return c
}

func copyParams(p map[string]string) map[string]string {
	if p == nil {
		return nil
	}
	c := make(map[string]string, len(p))
	for k, v := range p {
		c[k] = v
	}
	return c
}

type candidate struct {
	c    cases.Case
	what string
}

// candidates lists smaller variants of c, biggest reductions first.
func candidates(c cases.Case) []candidate {
	var out []candidate
	add := func(what string, f func(*cases.Case) bool) {
		n := c
		n.SeqLens = append([]int(nil), c.SeqLens...)
		n.Params = copyParams(c.Params)
		if f(&n) {
			out = append(out, candidate{n, what})
		}
	}
	// Requests: keep one half, then drop one at a time.
	if b := len(c.SeqLens); b > 1 {
		add(fmt.Sprintf("requests %d -> %d (first half)", b, (b+1)/2), func(n *cases.Case) bool {
			n.SeqLens = n.SeqLens[:(b+1)/2]
			n.Batch = len(n.SeqLens)
			return true
		})
		for i := 0; i < b; i++ {
			add(fmt.Sprintf("requests %d -> %d (drop request %d)", b, b-1, i), func(n *cases.Case) bool {
				n.SeqLens = append(n.SeqLens[:i], n.SeqLens[i+1:]...)
				n.Batch = len(n.SeqLens)
				return true
			})
		}
	} else if c.Batch > 1 && len(c.SeqLens) == 0 { // splitk_combine rows come from Batch
		add(fmt.Sprintf("batch %d -> %d", c.Batch, c.Batch/2), func(n *cases.Case) bool { n.Batch /= 2; return true })
	}
	// Context: halve, drop a page, drop a token (each request).
	for i, s := range c.SeqLens {
		for _, to := range []int{s / 2, s - c.PageSize, s - 1} {
			if to < 1 || to >= s {
				continue
			}
			add(fmt.Sprintf("seq_lens[%d] %d -> %d", i, s, to), func(n *cases.Case) bool { n.SeqLens[i] = to; return true })
		}
	}
	halve := func(name string, v int, min int, set func(*cases.Case, int)) {
		if v/2 >= min && v > min {
			add(fmt.Sprintf("%s %d -> %d", name, v, v/2), func(n *cases.Case) bool { set(n, v/2); return true })
		}
	}
	halve("heads", c.Heads, 1, func(n *cases.Case, v int) { n.Heads = v })
	if c.SQ > 1 {
		add(fmt.Sprintf("s_q %d -> %d", c.SQ, c.SQ-1), func(n *cases.Case) bool { n.SQ--; return true })
	}
	halve("splits", c.Splits, 1, func(n *cases.Case, v int) { n.Splits = v })
	halve("topk", c.TopK, 1, func(n *cases.Case, v int) { n.TopK = v })
	halve("m", c.M, 1, func(n *cases.Case, v int) { n.M = v })
	halve("n", c.N, 1, func(n *cases.Case, v int) { n.N = v })
	if c.K >= 32 && (c.K/2)%16 == 0 {
		halve("k", c.K, 16, func(n *cases.Case, v int) { n.K = v })
	}
	if sz := sizesOf(c); c.KVCacheDType != "fp8_ds_mla" && sz.Latent > 0 {
		l := c.Latent
		if l == 0 {
			l = sz.Latent
		}
		halve("latent", l, 16, func(n *cases.Case, v int) { n.Latent = v })
	}
	halve("page_size", c.PageSize, 1, func(n *cases.Case, v int) { n.PageSize = v })
	return out
}

// Describe renders the shrunk case's non-default fields, for reports.
func Describe(c cases.Case) string {
	var parts []string
	add := func(k string, v any) { parts = append(parts, fmt.Sprintf("%s=%v", k, v)) }
	add("kernel", c.Kernel)
	if c.Preset != "" {
		add("preset", c.Preset)
	}
	for _, f := range []struct {
		k string
		v int
	}{{"heads", c.Heads}, {"latent", c.Latent}, {"s_q", c.SQ}, {"page_size", c.PageSize}, {"splits", c.Splits},
		{"m", c.M}, {"n", c.N}, {"k", c.K}, {"topk", c.TopK}, {"batch", c.Batch}} {
		if f.v != 0 {
			add(f.k, f.v)
		}
	}
	if len(c.SeqLens) > 0 {
		add("seq_lens", c.SeqLens)
	}
	if c.KVCacheDType != "" {
		add("kv_cache_dtype", c.KVCacheDType)
	}
	keys := make([]string, 0, len(c.Params))
	for k := range c.Params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		add(k, c.Params[k])
	}
	return strings.Join(parts, " ")
}
