// Package engines knows how vLLM, SGLang, FlashInfer and FlashMLA name and
// lay out the tensors of the kernels kcheck checks, so that a capture taken
// with an engine's own names and layouts checks without editing
// (`kcheck check --from ENGINE`).
//
// An Engine adapts a capture in five steps, per kernel (and per stage of a
// pipeline, under the stage prefix):
//  1. parameter names: the engine's spelling of a parameter becomes the
//     contract's (FlashInfer sm_scale -> softmax_scale);
//  2. parameter values: the engine's spelling of a value becomes the
//     contract's (vLLM kv_cache_dtype "fp8_e4m3", "half" -> "fp16", "auto"
//     kept as the contract's auto; "fp8" by the cache's entry width,
//     fp8_ds_mla or fp8_e4m3; FlashMLA is_fp8_kvcache);
//  3. defaults: what the engine leaves implicit (lse_base, lse_empty,
//     ds_mla_scale, scale_layout, global scale direction) is filled in when
//     the capture does not say it: the capture's own keys always win;
//  4. tensor names: the engine's argument and return names become the
//     contract's (FlashMLA k_cache -> kv_cache, cache_seqlens -> seq_lens,
//     softmax_lse -> lse);
//  5. layouts: pure data movement (reshape, permutation, concatenation,
//     stacking) into the contract's layout (FlashMLA's [NB, P, 1, D] cache
//     -> [NB, P, D]; FlashInfer's q_nope|q_pe -> q; its page lists -> a
//     block table; its lse [B*s_q, H] -> [B, H, s_q]).
//
// Nothing here computes a value the kernel produced, so a capture read
// through an engine holds exactly the bits the engine wrote. Every step is
// reported as a note in the check result.
//
// What was confirmed where. Each fact the tables and fixes use cites its
// source beside it (an installed package's version and file, or a
// repository path at a commit); ../shared/audit/ENGINES-2026-12.md audits
// the claims row by row (F1-F17, V1-V17, S1-S5, I1-I8), and
// internal/engines/CAPTURE.md says per engine what is read and what is not.
// The corrections the audit asked for, in brief:
//   - FlashMLA's dense decode has no FP8 mode (deepseek-ai/FlashMLA@9241ae3
//     csrc/api/dense_decode.h:35): is_fp8_kvcache = true reads only the
//     sparse decode's 656-byte fp8_ds_mla entry (F9). Its sparse decode
//     masks only -1 indices (F10): the flashmla and vllm tables set
//     invalid_index = minus_one.
//   - FlashMLA's fp8_ds_mla readers do not multiply by the stored F32 tile
//     scale: SM90 rounds it to bf16 (csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:550),
//     SM100 to E8M0 toward zero (csrc/sm100/decode/head64/kernel.cuh:708-709),
//     so a capture of either declares mla_decode_sparse's ds_mla_scale_read
//     (bf16, e8m0_rz; the default f32 is exact only for pow2 scales) (F15;
//     reference/CONTRACTS.md §3.7, §8.2).
//   - vLLM's fp8_ds_mla writer moved from amax to pow2 tile scales (vLLM PR
//     #49435): --from vllm reads the convention from the written scales
//     (dsMLAScaleFromData) instead of assuming one (V5).
//   - vLLM's gather is gather_and_maybe_dequant_cache(src_cache, dst,
//     block_table, cu_seq_lens, token_to_seq, num_tokens, kv_cache_dtype,
//     scale, seq_starts) (vllm 0.33.0 vllm/_custom_ops.py:3074-3084; V6).
//   - vLLM's and SGLang's Triton decode kernels store a split's lse as
//     e_max + log(e_sum) (base e) but write nothing for an empty split
//     (vllm 0.33.0 vllm/v1/attention/ops/triton_decode_attention.py,
//     :124 and :360, `if split_kv_end > split_kv_start:`; V13; sglang
//     0.5.23 sglang/kernels/ops/attention/decode_attention.py :649, S5):
//     such a split's partials are not data and are not judged
//     (fixes.go, unwrittenSplits).
//   - SGLang's sgl_kernel flash_mla_with_kvcache names the cache k_cache
//     (sgl-kernel/python/sgl_kernel/flash_mla.py@176ee5c7; S1).
//   - FlashInfer's MLA wrapper returns a base-2 lse unless
//     run(..., return_lse_base_on_e=True) (flashinfer 0.7.2.post1
//     flashinfer/mla/_batch_mla/_wrapper.py:852-864; I2).
//   - FlashInfer's FP8 MLA scales the latent and rope parts separately
//     (ckv_scale or ckv_scale_arr, kpe_scale) and holds a per-tensor scale
//     in bf16 (flashinfer 0.7.2.post1 _fa_common.py:692-711, mla.cuh:312-377):
//     read as mla_decode's k_scale, k_scale_tiles, k_scale_rope with
//     k_scale_dtype = bf16 (blackwell.go, flashInferFP8MLA; I5).
//   - vLLM's "auto" cache dtype is the model's dtype, bf16 or fp16 (vllm
//     0.33.0 vllm/utils/torch_utils.py:519-525): it is read as the
//     contract's auto, the cache tensor's own dtype, never assumed to be
//     bf16 (V1); FlashMLA's dense decode reads an fp16 cache too
//     (csrc/api/dense_decode.h:33-35; F17).
package engines

import (
	"fmt"
	"sort"
	"strings"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/suggest"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Engine is one engine's conventions.
type Engine struct {
	Name    string
	Summary string
	// Defaults are metadata the engine leaves implicit, for every kernel.
	Defaults map[string]string
	// Values translate the engine's spelling of a parameter value.
	Values map[string]map[string]string
	// Refused are the engine's parameter values kcheck has no contract for,
	// each with why, so that a capture declaring one is refused with a
	// reason rather than a bare "unknown value" (or misread as another).
	Refused map[string]map[string]string
	// Kernels holds the per-kernel conventions, by contract kernel name.
	Kernels map[string]Kernel
}

// Kernel is an engine's conventions for one contract kernel.
type Kernel struct {
	// Tensors maps the engine's tensor names to the contract's.
	Tensors map[string]string
	// Params maps the engine's parameter names to the contract's.
	Params map[string]string
	// Defaults are metadata defaults for this kernel only.
	Defaults map[string]string
	// Fixes convert layouts after renaming (pure data movement).
	Fixes []Fix
	// Identify lists tensor names (engine or contract) whose presence
	// identifies the kernel in a capture that does not name it.
	Identify []string
}

// Fix is one layout conversion. It reads and writes a stage's tensors and
// parameters through v and returns a note for each thing it changed.
type Fix struct {
	Doc   string
	Apply func(v *View) ([]string, error)
}

// View is one kernel's part of a capture: the tensors and metadata under a
// stage prefix ("" for a single-kernel capture, "attn." for a stage).
type View struct {
	Prefix  string
	Kernel  string
	Meta    map[string]string
	Tensors map[string]*tensor.Tensor
	// filled holds the parameters step 3 filled in from the engine's
	// defaults, so that a fix can tell a capture's own key (which always
	// wins) from a default it may still have to decide (a base the call's
	// arguments determine).
	filled map[string]bool
}

// T returns the tensor name of this view, or nil.
func (v *View) T(name string) *tensor.Tensor { return v.Tensors[v.Prefix+name] }

// Set stores a tensor under name.
func (v *View) Set(name string, t *tensor.Tensor) { v.Tensors[v.Prefix+name] = t }

// Del removes a tensor.
func (v *View) Del(name string) { delete(v.Tensors, v.Prefix+name) }

// Param returns a parameter of this view.
func (v *View) Param(name string) (string, bool) {
	s, ok := v.Meta[v.Prefix+name]
	return s, ok
}

// Bool reads a flag of the engine's call as a capture records it: true or
// false in any case (Python's str(True) is "True"), or 1 or 0; set says
// whether the capture records it at all.
func (v *View) Bool(name string) (val, set bool, err error) {
	s, ok := v.Param(name)
	if !ok {
		return false, false, nil
	}
	switch strings.ToLower(s) {
	case "true", "1":
		return true, true, nil
	case "false", "0":
		return false, true, nil
	}
	return false, true, fmt.Errorf("parameter %s = %q: want true or false", name, s)
}

// Declared says whether the capture itself set a parameter (under its
// contract name or after step 1's renaming), as opposed to an engine
// default filled in by step 3.
func (v *View) Declared(name string) bool {
	_, ok := v.Param(name)
	return ok && !v.filled[name]
}

// SetParam sets a parameter of this view.
func (v *View) SetParam(name, val string) { v.Meta[v.Prefix+name] = val }

var registry = map[string]*Engine{}

// register adds e to the table --from reads. A second engine under a
// name would silently replace the first (and which one --from applied
// would depend on init order), and a name that is not lower case could
// never be found (Lookup lowercases what the user typed): both are
// programming errors, so register panics naming them.
func register(e *Engine) {
	if err := registerIn(registry, e); err != nil {
		panic("engines: " + err.Error())
	}
}

// registerIn adds e to reg, or says why it refuses.
func registerIn(reg map[string]*Engine, e *Engine) error {
	switch {
	case e.Name == "":
		return fmt.Errorf("an engine without a name")
	case e.Name != strings.ToLower(e.Name):
		return fmt.Errorf("engine %q: names are lower case (Lookup lowercases --from's argument)", e.Name)
	}
	if _, dup := reg[e.Name]; dup {
		return fmt.Errorf("engine %q registered twice: the second would replace the first", e.Name)
	}
	reg[e.Name] = e
	return nil
}

// Lookup returns the engine named name.
func Lookup(name string) (*Engine, error) {
	e, ok := registry[strings.ToLower(name)]
	if !ok {
		return nil, fmt.Errorf("--from %q: unknown engine%s (known: %s)", name, suggest.DidYouMean(name, Names()), strings.Join(Names(), ", "))
	}
	return e, nil
}

// Names lists the engines, sorted.
func Names() []string {
	var n []string
	for k := range registry {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Conventions returns the engine's kernel-independent metadata defaults, for
// check.Options.Conventions (the capture's own keys win there too).
func (e *Engine) Conventions() map[string]string {
	out := map[string]string{}
	for k, v := range e.Defaults {
		out[k] = v
	}
	return out
}

// Layout is check.Options.Engine: the named engine's conventions and
// adapter, as --from NAME applies them.
func Layout(name string) (map[string]string, func(map[string]string, map[string]*tensor.Tensor) ([]string, error), error) {
	e, err := Lookup(name)
	if err != nil {
		return nil, nil, err
	}
	return e.Conventions(), e.Adapt, nil
}

// Adapt rewrites a capture (its metadata and tensors, both modified in
// place: pass copies) from the engine's conventions to the contract's and
// returns notes saying what it did. It is check.Options.Adapt.
func (e *Engine) Adapt(meta map[string]string, tensors map[string]*tensor.Tensor) ([]string, error) {
	// The fixes read values (slot ids, lengths, scales) as they convert:
	// every tensor's bytes must match its shape and dtype first, or a
	// short one is read past its end.
	names := make([]string, 0, len(tensors))
	for name := range tensors {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := checked(name, tensors[name]); err != nil {
			return nil, err
		}
	}
	var notes []string
	kname := meta["kcheck.kernel"]
	if kname == "" {
		k, err := e.identify(tensors)
		if err != nil {
			return nil, err
		}
		if k == "" {
			return nil, nil // the checker reports the missing kernel
		}
		meta["kcheck.kernel"] = k
		kname = k
		notes = append(notes, fmt.Sprintf("%s: kcheck.kernel not set; the tensor names say %s", e.Name, k))
	}
	var views []*View
	if kname == "pipeline" {
		for _, p := range strings.Split(meta["kcheck.stages"], ",") {
			p = strings.TrimSpace(p)
			if p == "" {
				continue
			}
			views = append(views, &View{Prefix: p + ".", Kernel: meta["kcheck."+p+".kernel"], Meta: meta, Tensors: tensors})
		}
	} else {
		views = []*View{{Kernel: kname, Meta: meta, Tensors: tensors}}
	}
	for _, v := range views {
		n, err := e.adaptView(v)
		if err != nil {
			if v.Prefix != "" {
				return nil, fmt.Errorf("stage %s: %v", strings.TrimSuffix(v.Prefix, "."), err)
			}
			return nil, err
		}
		notes = append(notes, n...)
	}
	return notes, nil
}

func (e *Engine) adaptView(v *View) ([]string, error) {
	var notes []string
	kc := e.Kernels[v.Kernel]
	where := ""
	if v.Prefix != "" {
		where = " (stage " + strings.TrimSuffix(v.Prefix, ".") + ")"
	}
	// 1. parameter names.
	for _, from := range sortedKeys(kc.Params) {
		to := kc.Params[from]
		val, ok := v.Param(from)
		if !ok {
			continue
		}
		if _, has := v.Param(to); has {
			notes = append(notes, fmt.Sprintf("%s: parameter %s ignored: %s is also set%s", e.Name, from, to, where))
			continue
		}
		v.SetParam(to, val)
		notes = append(notes, fmt.Sprintf("%s: parameter %s read as %s%s", e.Name, from, to, where))
	}
	// 2. parameter values.
	for _, key := range sortedKeys(e.Refused) {
		if val, ok := v.Param(key); ok {
			if why, refused := e.Refused[key][val]; refused {
				return nil, fmt.Errorf("parameter %s = %q: %s's %q has no kcheck contract: %s", key, val, e.Name, val, why)
			}
		}
	}
	for _, key := range sortedKeys(e.Values) {
		val, ok := v.Param(key)
		if !ok {
			continue
		}
		if to, ok := e.Values[key][val]; ok && to != val {
			v.SetParam(key, to)
			notes = append(notes, fmt.Sprintf("%s: %s = %q read as %q%s", e.Name, key, val, to, where))
		}
	}
	// 3. defaults (the capture's keys win).
	var filled []string
	for _, d := range []map[string]string{kc.Defaults, e.Defaults} {
		for _, key := range sortedKeys(d) {
			if _, ok := v.Param(key); !ok {
				v.SetParam(key, d[key])
				if v.filled == nil {
					v.filled = map[string]bool{}
				}
				v.filled[key] = true
				filled = append(filled, key+" = "+d[key])
			}
		}
	}
	if len(filled) > 0 {
		notes = append(notes, fmt.Sprintf("%s conventions applied%s: %s", e.Name, where, strings.Join(filled, ", ")))
	}
	// 4. tensor names, all at once so that names may trade places.
	moves := map[string]*tensor.Tensor{}
	var renamed []string
	for _, from := range sortedKeys(kc.Tensors) {
		to := kc.Tensors[from]
		t := v.T(from)
		if t == nil || from == to {
			continue
		}
		if _, taken := kc.Tensors[to]; v.T(to) != nil && !taken {
			notes = append(notes, fmt.Sprintf("%s: tensor %s%s ignored: %s%s is also present", e.Name, v.Prefix, from, v.Prefix, to))
			continue
		}
		if moves[to] != nil {
			return nil, fmt.Errorf("tensors %s and another engine name both map to %s: keep one", from, to)
		}
		moves[to] = t
		v.Del(from)
		renamed = append(renamed, from+" -> "+to)
	}
	for to, t := range moves {
		v.Set(to, t)
	}
	if len(renamed) > 0 {
		notes = append(notes, fmt.Sprintf("%s tensor names%s: %s", e.Name, where, strings.Join(renamed, ", ")))
	}
	// 5. layouts.
	for _, f := range kc.Fixes {
		n, err := f.Apply(v)
		if err != nil {
			return nil, err
		}
		for _, s := range n {
			notes = append(notes, fmt.Sprintf("%s: %s%s", e.Name, s, where))
		}
	}
	return notes, nil
}

// identify names the kernel whose identifying tensors are all present;
// an error when several fit.
func (e *Engine) identify(tensors map[string]*tensor.Tensor) (string, error) {
	var fits []string
	for _, k := range sortedKeys(e.Kernels) {
		id := e.Kernels[k].Identify
		if len(id) == 0 {
			continue
		}
		all := true
		for _, n := range id {
			if tensors[n] == nil {
				all = false
			}
		}
		if all {
			fits = append(fits, k)
		}
	}
	if len(fits) > 1 {
		return "", fmt.Errorf("metadata kcheck.kernel is missing and the %s tensor names fit %s: set it (--set kcheck.kernel=NAME)", e.Name, strings.Join(fits, " and "))
	}
	if len(fits) == 1 {
		return fits[0], nil
	}
	return "", nil
}

func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	sort.Strings(k)
	return k
}

// Hint says which engine's conventions a capture's tensor names are, for
// a check made without --from that went wrong (a missing tensor, tensors
// the contract ignores): "tensor names k_cache, cache_seqlens are what
// flashmla, sglang and vllm call them: try --from flashmla (or sglang,
// vllm)", the engines that know the most of them. Names that are an
// engine's own (its argument names and the names that identify its
// kernels, other than the contract's) count; "" when none of the
// capture's are.
func Hint(meta map[string]string, names []string) string {
	type view struct{ prefix, kernel string }
	var views []view
	switch k := meta["kcheck.kernel"]; k {
	case "pipeline":
		for _, p := range strings.Split(meta["kcheck.stages"], ",") {
			if p = strings.TrimSpace(p); p != "" {
				views = append(views, view{p + ".", meta["kcheck."+p+".kernel"]})
			}
		}
	case "":
		for _, k := range kernel.Names() { // not said: any kernel's
			views = append(views, view{"", k})
		}
	default:
		views = []view{{"", k}}
	}
	present := map[string]bool{}
	for _, n := range names {
		present[n] = true
	}
	best, bestNames := []string(nil), []string(nil)
	for _, ename := range Names() {
		e := registry[ename]
		seen := map[string]bool{}
		var found []string
		for _, v := range views {
			kc, ok := e.Kernels[v.kernel]
			if !ok {
				continue
			}
			contract := map[string]bool{}
			if k, err := kernel.Lookup(v.kernel); err == nil {
				for _, s := range append(append([]kernel.TensorSpec(nil), k.Spec().Inputs...), k.Spec().Outputs...) {
					contract[s.Name] = true
				}
			}
			own := append(sortedKeys(kc.Tensors), kc.Identify...)
			for _, n := range own {
				if full := v.prefix + n; !contract[n] && present[full] && !seen[full] {
					seen[full] = true
					found = append(found, full)
				}
			}
		}
		switch {
		case len(found) == 0 || len(found) < len(bestNames):
		case len(found) > len(bestNames):
			best, bestNames = []string{ename}, found
		default:
			best = append(best, ename)
		}
	}
	if len(best) == 0 {
		return ""
	}
	sort.Strings(bestNames)
	if len(best) == 1 {
		return fmt.Sprintf("tensor names %s are %s's: try --from %s", strings.Join(bestNames, ", "), best[0], best[0])
	}
	return fmt.Sprintf("tensor names %s are what %s and %s call them: try --from %s (or %s)", strings.Join(bestNames, ", "),
		strings.Join(best[:len(best)-1], ", "), best[len(best)-1], best[0], strings.Join(best[1:], ", "))
}
