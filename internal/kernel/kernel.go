// Package kernel is the framework every kernel is built on and the
// vocabulary the rest of kcheck shares: a kernel's contract (Spec: name,
// stage, tensors, documented parameters), the one validation of its inputs
// (Validate, which turns them into a typed Problem), the declared precision
// a kernel computes at, the reference side of each output check (the exact
// float64 value, the value a correct kernel of the declared precision
// gives, and the coordinates that name an element in the kernel's own
// terms), and the optional capabilities the tools ask a kernel for (its
// cost, its inputs for a catalog case, its slicing, its contexts, its
// minimum traffic).
//
// It holds no kernel: each family lives in its own folder under
// internal/kernels and registers itself, and internal/kernels/all is the
// one list of them. Adding a kernel adds a folder and touches no switch.
package kernel

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/kcheck-dev/kcheck/internal/suggest"
	"github.com/kcheck-dev/kcheck/reference/mla"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// The stage names of reference/CONTRACTS.md §7.1.
const (
	StageQuant   = "quant"
	StageCache   = "cache"
	StageAttn    = "attn"
	StageCombine = "combine"
)

// Params are a kernel's parameters as the evidence file's metadata states
// them (strings, reference/CONTRACTS.md §1.2).
type Params map[string]string

// String returns the parameter or def when absent.
func (p Params) String(name, def string) string {
	if v, ok := p[name]; ok && v != "" {
		return v
	}
	return def
}

// Enum returns the parameter, def when absent, or an error when it is not one of allowed.
func (p Params) Enum(name, def string, allowed ...string) (string, error) {
	v := p.String(name, def)
	for _, a := range allowed {
		if v == a {
			return v, nil
		}
	}
	return "", fmt.Errorf("parameter %s = %q: want one of %s", name, v, strings.Join(allowed, ", "))
}

// Float parses a float parameter (Go's FormatFloat form, or +inf/-inf).
// ok is false when the parameter is absent.
func (p Params) Float(name string) (v float64, ok bool, err error) {
	s, present := p[name]
	if !present || s == "" {
		return 0, false, nil
	}
	switch strings.ToLower(s) {
	case "+inf", "inf":
		return math.Inf(1), true, nil
	case "-inf":
		return math.Inf(-1), true, nil
	}
	v, err = strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, true, fmt.Errorf("parameter %s = %q is not a number", name, s)
	}
	return v, true, nil
}

// RequiredFloat parses a float parameter that has no default.
func (p Params) RequiredFloat(name string) (float64, error) {
	v, ok, err := p.Float(name)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("parameter %s is missing (it has no default)", name)
	}
	return v, nil
}

// Int parses an integer parameter, def when absent.
func (p Params) Int(name string, def int) (int, error) {
	s, ok := p[name]
	if !ok || s == "" {
		return def, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("parameter %s = %q is not an integer", name, s)
	}
	return v, nil
}

// Bool parses a boolean parameter (true/false), def when absent.
func (p Params) Bool(name string, def bool) (bool, error) {
	s, ok := p[name]
	if !ok || s == "" {
		return def, nil
	}
	switch s {
	case "true", "1":
		return true, nil
	case "false", "0":
		return false, nil
	}
	return false, fmt.Errorf("parameter %s = %q: want true or false", name, s)
}

// Precision is what a kernel declares it rounds where (reference/CONTRACTS.md §1.1). The
// EXPECTED reference emulates it; the EXACT reference ignores it.
type Precision struct {
	// Acc is the dtype of every reduction's accumulator (acc_dtype, F32).
	Acc tensor.DType
	// P is the dtype the softmax numerators are rounded to before the PV
	// product (p_dtype, BF16).
	P tensor.DType
	// KVDequant is what an FP8 cache entry is dequantized to before the
	// products (kv_dequant_dtype, BF16).
	KVDequant tensor.DType
	// FP8Saturate: conversions to FP8 saturate (fp8_saturate, true).
	FP8Saturate bool
	// SoftmaxBlock is the number of tokens an attention kernel takes its
	// running softmax max over before rounding P (softmax_block; 0, not
	// declared: FlashMLA's 64). A kernel with 32-token tiles rounds P
	// against a max that is updated twice as often, which moves P's bf16
	// rounding by more than the tolerance allows for a 64-token model.
	SoftmaxBlock int
}

// DefaultPrecision is what the engines' kernels do: fp32 accumulation, bf16
// P, bf16 dequantized KV, saturating FP8 stores.
func DefaultPrecision() Precision {
	return Precision{Acc: tensor.F32, P: tensor.BF16, KVDequant: tensor.BF16, FP8Saturate: true}
}

var precisionDTypes = map[string]tensor.DType{
	"f64": tensor.F64, "f32": tensor.F32, "bf16": tensor.BF16, "f16": tensor.F16, "fp16": tensor.F16,
	"F64": tensor.F64, "F32": tensor.F32, "BF16": tensor.BF16, "F16": tensor.F16,
}

// MaxSoftmaxBlock bounds softmax_block: the reference's scratch space
// grows with it.
const MaxSoftmaxBlock = mla.MaxSoftmaxBlock

// PrecisionFrom reads acc_dtype, p_dtype, kv_dequant_dtype, fp8_saturate
// and softmax_block from params over the defaults.
func PrecisionFrom(p Params) (Precision, error) {
	pr := DefaultPrecision()
	for _, f := range []struct {
		key string
		dst *tensor.DType
	}{{"acc_dtype", &pr.Acc}, {"p_dtype", &pr.P}, {"kv_dequant_dtype", &pr.KVDequant}} {
		s, ok := p[f.key]
		if !ok || s == "" {
			continue
		}
		d, known := precisionDTypes[s]
		if !known {
			return pr, fmt.Errorf("parameter %s = %q: want f64, f32, bf16 or f16", f.key, s)
		}
		*f.dst = d
	}
	sat, err := p.Bool("fp8_saturate", true)
	if err != nil {
		return pr, err
	}
	pr.FP8Saturate = sat
	if s, ok := p["softmax_block"]; ok && s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxSoftmaxBlock {
			return pr, fmt.Errorf("parameter softmax_block = %q: want a whole number of tokens from 1 to %d", s, MaxSoftmaxBlock)
		}
		pr.SoftmaxBlock = n
	}
	return pr, nil
}

// Inputs are a kernel invocation's input tensors and parameters.
type Inputs struct {
	Tensors map[string]*tensor.Tensor
	Params  Params
	// OutputShapes are the shapes of the outputs the kernel under test
	// stored, by name, when there are any (a capture's); nil when a
	// backend is to make them. A size that only an output's shape gives
	// is read here: the split count S of mla_decode's partials, which
	// engines do not pass as a parameter (reference/CONTRACTS.md §3.6.1). The reference's
	// shapes are still checked against the actual ones.
	OutputShapes map[string][]int
}

// Mode says how an output is compared.
type Mode int

const (
	// Numeric outputs are judged three-way against Exact and Expected.
	Numeric Mode = iota
	// Bitwise outputs (quantized codes, cache bytes) must equal Expected,
	// except where Equivalent says a different value is also correct.
	Bitwise
)

// Output is the reference side of one output tensor.
type Output struct {
	Name  string
	Shape []int
	// DType is the dtype Expected is rounded to (the actual output's).
	DType tensor.DType
	// Exact is the float64 reference; Expected is what a correct kernel of
	// the declared precision produces (Expected == Exact is allowed). Both
	// are read-only; see Values for why they need not be in memory.
	Exact, Expected Values
	Mode            Mode
	// Equivalent, when set, reports whether an actual value that differs
	// from Expected at flat index i is still correct (a rounding tie, a
	// reordered top-k tie, an unwritten padding byte...).
	Equivalent func(i int, actual float64) bool
	// EquivalentConcurrent says Equivalent keeps no state, so that the
	// comparison may call it from several goroutines at once: a failing
	// check's differing elements are then excused on every core rather
	// than on one (a third of a failing fp8_ds_mla cache write's wall
	// time, issue 17). Unset, it is called from one goroutine only.
	EquivalentConcurrent bool
	// Reduction is the length of the longest reduction behind one element
	// (K for a GEMM, tokens for attention), for the gamma_n bounds.
	Reduction int
	// Noise, when set, is the rms of the error a correct kernel makes at
	// each element that Expected does not make the same way: an
	// accumulation whose order is the kernel's own (an lse's fp32 scores,
	// reference/mla ScoreNoise). The three-way policy adds it to the
	// floor's typical size, as another independent draw; NoiseWhat names
	// it for the tolerance's explanation.
	Noise     Values
	NoiseWhat string
	// Coords names the element's coordinates in the kernel's terms.
	Coords Coords
	// Before, for an output written in place (a cache after a write), is
	// what the buffer held before the kernel ran: failing elements that
	// still hold it were never written, which no position shows.
	Before Values
	// Suspects are bugs whose effect the kernel can compute: what the
	// output would hold had the kernel under test that bug. A failure
	// whose failing elements hold one suspect's values is named after it
	// (internal/signature), where no position could tell a block-table
	// shift from a page-size mismatch.
	Suspects []Suspect
	// Notes are facts about the output that do not change its verdict,
	// for the result's notes: what a declared reading costs against the
	// exact one (an fp8_ds_mla tile scale read as E8M0), as a number.
	Notes []string
}

// Suspect is one bug an output's failures may be explained by.
type Suspect struct {
	// Pattern is the signature pattern that names it (one internal/signature
	// declares).
	Pattern string
	// Detail says what the bug is, completing "the failing elements hold
	// what ... leaves".
	Detail string
	// Values are the output as that bug leaves it, read in order once.
	Values Values
	// Within, when set, is how far an element may lie from Values and
	// still hold it: a numeric suspect computed in one summation order
	// meets a kernel that sums in another (nil: bit for bit).
	Within Values
}

// Coords names an output element's position the way the kernel thinks of
// it. Axes names the dimensions of the output's shape; Derived, when set,
// appends to dst the coordinates the shape does not show (page, token mod
// page size, split, 16-element block, 128-row tile...) for signatures and
// returns it: appending, so that naming every failing element of a cache
// allocates nothing.
type Coords struct {
	Axes    []CoordKind
	Derived func(dst []Coord, idx []int) []Coord
}

// Coord is one coordinate of an element: its kind (which is also its name)
// and its value.
type Coord struct {
	Kind  CoordKind
	Value int
}

// Name is the coordinate's name in reports and JSON: its kind.
func (c Coord) Name() string { return string(c.Kind) }

// Name returns every coordinate of idx: the axes, then the derived ones.
func (c Coords) Name(idx []int) []Coord {
	return c.NameInto(make([]Coord, 0, len(idx)+4), idx)
}

// NameInto is Name appended to dst[:0], for a loop over many elements
// that keeps no element's coordinates.
func (c Coords) NameInto(dst []Coord, idx []int) []Coord {
	out := dst[:0]
	for d, v := range idx {
		var kind CoordKind
		if d < len(c.Axes) {
			kind = c.Axes[d]
		} else {
			// An axis the kernel does not name: no declared kind. Made only
			// here: a Sprintf for every axis of every element was an eighth
			// of a failing cache check (issue 17).
			kind = CoordKind("dim" + strconv.Itoa(d))
		}
		out = append(out, Coord{kind, v})
	}
	if c.Derived != nil {
		out = c.Derived(out, idx)
	}
	return out
}

// TensorSpec is one tensor of a contract.
type TensorSpec struct {
	Name     string
	DTypes   []tensor.DType // accepted dtypes
	Optional bool
	// Rank, when nonzero, is the contract's rank; a pipeline link from a
	// tensor of higher rank flattens its leading dimensions to reach it
	// (attn.partial_out [B,s_q,H,S,L] feeding combine.partial_out [N,S,L]).
	Rank int
	// Read, when set, says which elements of this input the kernel reads
	// (flat indices), for the notes on NaN and Inf in inputs: a paged
	// cache's entries of the tokens the requests attend. The rest (pages no
	// request owns, the tail of a last page, a cache a writer only writes
	// into) may hold anything; engines and kcheck's own generator poison
	// them with NaN on purpose. nil: every element is read. An error (an
	// unusable block table) means the reference will refuse the inputs
	// with a better message. The function it returns is called from
	// several goroutines at once (the scan is parallel), so it only reads.
	Read func(in Inputs) (func(flat int) bool, error)
	// Meaningful are the special values the contract gives a meaning to in
	// this input (-inf in partial_lse: an empty split): not anomalies.
	Meaningful []float64
}

// Anomalous reports whether v, read from an input of spec s, is a special
// value (NaN or an infinity) the contract gives no meaning to there.
func (s TensorSpec) Anomalous(v float64) bool {
	if !math.IsNaN(v) && !math.IsInf(v, 0) {
		return false
	}
	for _, m := range s.Meaningful {
		if v == m || (math.IsNaN(v) && math.IsNaN(m)) {
			return false
		}
	}
	return true
}

// Spec is one contract of reference/CONTRACTS.md §3: what a kernel is called, the
// pipeline stage it belongs to, its tensors and its parameters.
type Spec struct {
	Name    string
	Stage   string
	Summary string
	Inputs  []TensorSpec
	Outputs []TensorSpec
	// Params are the parameters the kernel reads from the evidence file's
	// metadata, each documented; the precision parameters (acc_dtype,
	// p_dtype...) are every kernel's and are not repeated here.
	Params []ParamSpec
}

// Problem is what a kernel's Validate made of its inputs: the tensors and
// parameters, checked and typed. Only the kernel that made it reads its
// fields; everyone else passes it on.
type Problem interface {
	// Inputs returns the inputs the problem was made from.
	Inputs() Inputs
}

// OutDTypes gives the dtype of each output as the kernel under test stored
// it (from the capture); an output it does not name gets the contract's
// default dtype.
type OutDTypes map[string]tensor.DType

// Kernel is one kernel family member: its contract, the one validation of
// its inputs, and its reference.
//
// Every kernel also implements the capabilities of capabilities.go
// (Coster, Generator, Slicer, Contexter, Roofliner); the registry test
// (internal/kernels/all) fails a kernel that lacks one.
type Kernel interface {
	Spec() *Spec
	// Validate checks the inputs against what the spec's TensorSpecs
	// cannot say (shapes, values, parameters), naming the tensor and index
	// of any inconsistency, and returns the typed problem. Call it through
	// kernel.Validate, which checks presence and dtypes first.
	Validate(in Inputs) (Problem, error)
	// Reference returns the reference side of every output of p at
	// precision prec. Expected is rounded to out's dtype for each output,
	// so Produce can store it without a second rounding.
	//
	// A reference stops soon after ctx is done (between units of work:
	// rows, heads, tiles, blocks of tokens) and returns ctx.Err(), so a
	// check past its deadline frees its memory instead of running on.
	Reference(ctx context.Context, p Problem, prec Precision, out OutDTypes) ([]Output, error)
}

// Validate is the one validation of a kernel's inputs: each required
// input present and each present one of an accepted dtype, in the order
// the contract lists them, then the kernel's own Validate.
func Validate(k Kernel, in Inputs) (Problem, error) {
	if err := checkInputs(k.Spec().Inputs, in); err != nil {
		return nil, err
	}
	return k.Validate(in)
}

// Evaluate validates in and runs k's reference on it: what a check does.
func Evaluate(ctx context.Context, k Kernel, in Inputs, prec Precision, out OutDTypes) ([]Output, error) {
	if err := checkInputs(k.Spec().Inputs, in); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p, err := k.Validate(in)
	if err != nil {
		return nil, err
	}
	return k.Reference(ctx, p, prec, out)
}

// Produce runs k's reference at precision prec and stores each output's
// Expected values in its dtype: what a correct kernel of that precision
// writes. It is the reference backend and the fixture generator. An output
// computed on demand is written straight into its tensor (Materialize).
func Produce(ctx context.Context, k Kernel, in Inputs, prec Precision, outDTypes OutDTypes) (map[string]*tensor.Tensor, error) {
	outs, err := Evaluate(ctx, k, in, prec, outDTypes)
	if err != nil {
		return nil, err
	}
	res := make(map[string]*tensor.Tensor, len(outs))
	for _, o := range outs {
		if res[o.Name], err = MaterializeContext(ctx, o.DType, o.Shape, o.Expected); err != nil {
			return nil, err
		}
	}
	return res, nil
}

var registry = map[string]Kernel{}

// Register adds k; registering a name twice is a programming error. The
// families register from their init functions; internal/kernels/all
// imports every family.
func Register(k Kernel) {
	name := k.Spec().Name
	if _, dup := registry[name]; dup {
		panic("kernel: " + name + " registered twice")
	}
	registry[name] = k
}

// checkInputs reports the first input, in contract order, that is missing
// (and required) or of a dtype the contract does not accept.
func checkInputs(specs []TensorSpec, in Inputs) error {
	for _, s := range specs {
		t, ok := in.Tensors[s.Name]
		if !ok {
			if s.Optional {
				continue
			}
			return fmt.Errorf("tensor %s is missing (the contract needs it)", s.Name)
		}
		if err := CheckDType(s.Name, t, s.DTypes...); err != nil {
			return err
		}
	}
	return nil
}

// Lookup returns the kernel named name.
func Lookup(name string) (Kernel, error) {
	k, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("unknown kernel %q%s (known: %s)", name, suggest.DidYouMean(name, Names()), strings.Join(Names(), ", "))
	}
	return k, nil
}

// All returns every registered kernel, sorted by name.
func All() []Kernel {
	var ks []Kernel
	for _, n := range Names() {
		ks = append(ks, registry[n])
	}
	return ks
}

// Names lists the registered kernels, sorted.
func Names() []string {
	var n []string
	for k := range registry {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Need returns the named input, or an error naming it when it is missing or
// of a dtype the contract does not accept.
func Need(in Inputs, name string, dtypes ...tensor.DType) (*tensor.Tensor, error) {
	t, ok := in.Tensors[name]
	if !ok {
		return nil, fmt.Errorf("tensor %s is missing (the contract needs it)", name)
	}
	return t, CheckDType(name, t, dtypes...)
}

// CheckDType returns an error naming the tensor when its dtype is not one of dtypes.
func CheckDType(name string, t *tensor.Tensor, dtypes ...tensor.DType) error {
	if len(dtypes) == 0 {
		return nil
	}
	for _, d := range dtypes {
		if t.DType == d {
			return nil
		}
	}
	ds := make([]string, len(dtypes))
	for i, d := range dtypes {
		ds[i] = string(d)
	}
	return fmt.Errorf("tensor %s has dtype %s; the contract wants %s", name, t.DType, strings.Join(ds, " or "))
}

// CheckShape returns an error naming the tensor when its shape is not want
// (-1 in want matches any size).
func CheckShape(name string, t *tensor.Tensor, want ...int) error {
	ok := len(t.Shape) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = want[i] < 0 || want[i] == t.Shape[i]
	}
	if !ok {
		return fmt.Errorf("tensor %s has shape %v; the contract wants %v", name, t.Shape, fmtShape(want))
	}
	return nil
}

func fmtShape(s []int) string {
	parts := make([]string, len(s))
	for i, v := range s {
		if v < 0 {
			parts[i] = "*"
		} else {
			parts[i] = strconv.Itoa(v)
		}
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// NotWrittenKey is the output-file metadata key in which a worker names
// the contract outputs its kernel does not produce (comma-separated), as
// SGLang's Triton decode writes no final lse (its stage 2 stores o only).
// Those outputs are absent by declaration, not by accident: the rest are
// judged and the result says which were not (reference/CONTRACTS.md §9.1).
const NotWrittenKey = "kcheck.worker.not_written"

// LayoutKey is the output-file metadata key by which a worker says its OUT
// is a capture of the engine's own call, in that engine's names and
// layouts (SGLang's k_buffer, kv_indptr, attn_logits, ...): kcheck then
// judges OUT alone, read as `kcheck check --from ENGINE` reads a capture of
// that engine, so a run of the engine and a capture of it are read by the
// one engine table (reference/CONTRACTS.md §9.1).
const LayoutKey = "kcheck.worker.layout"

// NotWritten parses meta's NotWrittenKey for kernel k: the set of outputs
// declared unwritten, or an error naming a name that is not one of k's
// outputs.
func NotWritten(k Kernel, meta map[string]string) (map[string]bool, error) {
	v, ok := meta[NotWrittenKey]
	if !ok || v == "" {
		return nil, nil
	}
	outputs := map[string]bool{}
	for _, o := range k.Spec().Outputs {
		outputs[o.Name] = true
	}
	set := map[string]bool{}
	for _, name := range strings.Split(v, ",") {
		name = strings.TrimSpace(name)
		if !outputs[name] {
			return nil, fmt.Errorf("metadata %s = %q: %q is not an output of %s", NotWrittenKey, v, name, k.Spec().Name)
		}
		set[name] = true
	}
	return set, nil
}
