// Package check turns an evidence file into a verdict: it reads the capture,
// runs the reference on the captured inputs, compares every captured output
// three-way (exact, expected at the declared precision, actual) and, for a
// pipeline capture, attributes the failure to the first stage whose local
// error leaves its budget. It is the one mechanism behind `kcheck check`,
// `kcheck run` and the diagnosis commands.
package check

import (
	"context"
	"errors"
	"fmt"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"runtime/debug"
	"sort"
	"strings"

	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/parallel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Verdicts, as reference/CONTRACTS.md §7.2 spells them: compare's, the one
// Verdict type a check, a file, a stage and a diagnosis share.
const (
	Pass         = compare.Pass
	Fail         = compare.Fail
	Inconclusive = compare.Inconclusive
	Error        = compare.Error
)

// Result is one evidence file's outcome: the object `kcheck check --json`
// prints, one per file.
type Result struct {
	File    string          `json:"file"`
	Kernel  string          `json:"kernel"`
	Verdict compare.Verdict `json:"verdict"`
	Stage   *string         `json:"stage"`
	Checks  []compare.Check `json:"checks"`
	Error   *string         `json:"error"`
	// Stages holds a pipeline's per-stage outcome, in execution order.
	Stages []StageResult `json:"stages,omitempty"`
	// Notes are things worth knowing that do not change the verdict:
	// ignored extra tensors, NaN or Inf in inputs, conventions applied.
	Notes      []string          `json:"notes,omitempty"`
	Precision  *PrecisionInfo    `json:"precision,omitempty"`
	Policy     string            `json:"policy,omitempty"`
	Provenance map[string]string `json:"provenance,omitempty"`
}

// PrecisionInfo is the declared precision the expected reference emulated.
type PrecisionInfo struct {
	Acc         string `json:"acc_dtype"`
	P           string `json:"p_dtype"`
	KVDequant   string `json:"kv_dequant_dtype"`
	FP8Saturate bool   `json:"fp8_saturate"`
	// SoftmaxBlock is shown only when the file declares it (the default,
	// FlashMLA's 64, keeps every existing report as it was).
	SoftmaxBlock int `json:"softmax_block,omitempty"`
}

func precisionInfo(p kernel.Precision) *PrecisionInfo {
	return &PrecisionInfo{Acc: string(p.Acc), P: string(p.P), KVDequant: string(p.KVDequant), FP8Saturate: p.FP8Saturate, SoftmaxBlock: p.SoftmaxBlock}
}

// StageResult is one pipeline stage: its LOCAL checks (reference run on the
// stage's own captured inputs) and PROPAGATED checks (reference chain run
// from the first stage's inputs).
type StageResult struct {
	Prefix     string          `json:"prefix"`
	Kernel     string          `json:"kernel"`
	Stage      string          `json:"stage"`
	Verdict    compare.Verdict `json:"verdict"`
	Local      []compare.Check `json:"local"`
	Propagated []compare.Check `json:"propagated,omitempty"`
	Error      *string         `json:"error,omitempty"`
}

// Options tune a check.
type Options struct {
	// Policy is the tolerance policy; nil means compare.DefaultPolicy().
	Policy compare.Policy
	// WorstK is how many worst elements each check lists.
	WorstK int
	// Conventions fills in metadata an engine leaves implicit (--from).
	Conventions map[string]string
	// Aliases renames capture tensors to contract names before anything
	// reads them (name in the file -> contract name; also matched after a
	// pipeline stage prefix).
	Aliases map[string]string
	// Adapt, when set, rewrites a capture's metadata and tensors (copies)
	// from an engine's conventions to the contract's and returns notes
	// saying what it did (internal/engines: --from).
	Adapt func(meta map[string]string, tensors map[string]*tensor.Tensor) ([]string, error)
	// From names the engine whose adapter Adapt is ("" when none).
	From string
	// Engine, when set, finds an engine's conventions and adapter by name,
	// for a file that declares the layout it is in (kcheck.worker.layout:
	// a worker's OUT written in its engine's own names), read as From
	// would read it.
	Engine func(name string) (conventions map[string]string, adapt func(meta map[string]string, tensors map[string]*tensor.Tensor) ([]string, error), err error)
	// Hint, when set and Adapt is not, says what a check that went wrong
	// (verdict error, or tensors the contract ignores) might have needed
	// instead, from the capture's metadata and tensor names: the engine
	// whose names they are (engines.Hint: "try --from flashmla").
	Hint func(meta map[string]string, tensorNames []string) string
	// Observe, when set, sees every output comparison (reports build error
	// profiles from it).
	Observe func(Observation)
	// MaxMemory bounds a reference's estimated working set in bytes
	// (limits.go): 0 means DefaultMaxMemory(), negative means no bound. A
	// check over the bound is refused with verdict error, before it runs.
	MaxMemory int64
	// ElementPath judges every element on compare's general path
	// (compare.Options.ElementPath): what the tests hold the fast path to.
	ElementPath bool

	stage, kind string          // labels for Observe within a pipeline
	ctx         context.Context // Run's; checked between stages and outputs
}

// context is Run's context: the references and the comparison stop when
// it is done.
func (o Options) context() context.Context {
	if o.ctx == nil {
		return context.Background()
	}
	return o.ctx
}

func (o Options) policy() compare.Policy {
	if o.Policy != nil {
		return o.Policy
	}
	return compare.DefaultPolicy()
}

func (o Options) worstK() int {
	if o.WorstK > 0 {
		return o.WorstK
	}
	return 5
}

func errorResult(file, kern string, err error) Result {
	msg := err.Error()
	return Result{File: file, Kernel: kern, Verdict: Error, Error: &msg, Checks: []compare.Check{}}
}

// provenanceKeys are the metadata keys reference/CONTRACTS.md §1.2 lists as provenance.
var provenanceKeys = []string{"source", "device", "driver", "kernel_build", "captured_at"}

// run is Run's check of c, under opts.ctx. Its goroutine and the
// references' workers (reference/parallel) have panic-on-fault on, so a
// memory fault reading the mapped capture reaches the recover here.
func run(c evidence.Capture, opts Options) (res Result) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	mapped := c.Tensors // as read, before prepare renames or adapts them
	defer func() {
		if p := recover(); p != nil {
			res = errorResult(c.Name, c.Metadata["kcheck.kernel"], panicError(p, mapped, panicSite()))
		}
	}()
	defer func() { res.Notes = append(res.Notes, hint(c, res, opts)...) }()
	c, adaptNotes, err := prepare(c, opts)
	if err != nil {
		return errorResult(c.Name, c.Metadata["kcheck.kernel"], err)
	}
	meta := c.Metadata
	if f, ok := meta["kcheck.format"]; ok && f != "1" {
		return errorResult(c.Name, meta["kcheck.kernel"], fmt.Errorf("metadata kcheck.format = %q: this kcheck reads format 1", f))
	}
	kname, ok := meta["kcheck.kernel"]
	if !ok || kname == "" {
		return errorResult(c.Name, "", errors.New("metadata kcheck.kernel is missing: the file does not say which kernel it captured"))
	}
	if kname == "pipeline" {
		res = runPipeline(c, meta, opts)
	} else {
		res = runSingle(c, kname, meta, opts)
	}
	res.Notes = append(append(append([]string(nil), c.Notes...), adaptNotes...), res.Notes...)
	if e := meta["kcheck.emulation"]; e != "" {
		// An emulated run is never a GPU result: every report says so first.
		res.Notes = append([]string{e}, res.Notes...)
	}
	res.Notes = boundNotes(res.Notes)
	for _, k := range provenanceKeys {
		if v, ok := meta[k]; ok {
			if res.Provenance == nil {
				res.Provenance = map[string]string{}
			}
			res.Provenance[k] = v
		}
	}
	return res
}

// hint is opts.Hint's note on a check of c that went wrong (verdict
// error, or tensors the contract ignores), none when it went right or
// an engine's conventions were applied.
func hint(c evidence.Capture, res Result, opts Options) []string {
	if opts.Hint == nil || opts.Adapt != nil || (res.Verdict != Error && !ignoredTensors(res.Notes)) {
		return nil
	}
	names := make([]string, 0, len(c.Tensors))
	for n := range c.Tensors {
		names = append(names, n)
	}
	if h := opts.Hint(c.Metadata, names); h != "" {
		return []string{h}
	}
	return nil
}

// ignoredTensors reports whether notes say that tensors of the capture are
// no part of its contract (split's notes).
func ignoredTensors(notes []string) bool {
	for _, n := range notes {
		if strings.HasPrefix(n, "tensor ") && strings.HasSuffix(n, "contract: ignored") {
			return true
		}
	}
	return false
}

func withConventions(meta, conv map[string]string) map[string]string {
	if len(conv) == 0 {
		return meta
	}
	out := make(map[string]string, len(meta)+len(conv))
	for k, v := range conv {
		out[k] = v
	}
	for k, v := range meta { // the file's own declarations win
		out[k] = v
	}
	return out
}

// params returns the kernel's parameters: metadata keys without a "kcheck."
// prefix (reference/CONTRACTS.md §1.2 stores each parameter under its own name).
func params(meta map[string]string) kernel.Params {
	p := kernel.Params{}
	for k, v := range meta {
		if !strings.HasPrefix(k, "kcheck.") {
			p[k] = v
		}
	}
	return p
}

func runSingle(c evidence.Capture, kname string, meta map[string]string, opts Options) Result {
	k, err := kernel.Lookup(kname)
	if err != nil {
		return errorResult(c.Name, kname, fmt.Errorf("metadata kcheck.kernel: %v", err))
	}
	p := params(meta)
	prec, err := kernel.PrecisionFrom(p)
	if err != nil {
		return errorResult(c.Name, kname, err)
	}
	in, outs, notes := split(k, c.Tensors, "")
	if len(outs) == 0 {
		return errorResult(c.Name, kname, fmt.Errorf("the file holds none of %s's outputs (%s): nothing to check", kname, specNames(k.Spec().Outputs)))
	}
	notes = append(notes, inputAnomalies(opts.context(), k, kernel.Inputs{Tensors: in, Params: p})...)
	checks, refs, err := compareOutputs(k, kernel.Inputs{Tensors: in, Params: p}, prec, outs, opts)
	if err != nil {
		return errorResult(c.Name, kname, err)
	}
	notes = append(notes, outputNotes("", refs, outs)...)
	notWritten, err := kernel.NotWritten(k, meta)
	if err != nil {
		return errorResult(c.Name, kname, err)
	}
	for _, s := range k.Spec().Outputs {
		if _, ok := outs[s.Name]; !ok && notWritten[s.Name] {
			notes = append(notes, fmt.Sprintf("%s: not judged; the kernel that made this file writes none (%s)", s.Name, kernel.NotWrittenKey))
		}
	}
	return Result{
		File: c.Name, Kernel: kname, Verdict: compare.FileVerdict(checks), Checks: checks,
		Notes: notes, Precision: precisionInfo(prec), Policy: opts.policy().Name(),
	}
}

// outputNotes are the notes of the references of the outputs a capture
// stores (kernel.Output.Notes), each led by prefix.
func outputNotes(prefix string, refs []kernel.Output, outs map[string]*tensor.Tensor) []string {
	var notes []string
	for _, r := range refs {
		if _, ok := outs[r.Name]; ok {
			for _, n := range r.Notes {
				notes = append(notes, prefix+n)
			}
		}
	}
	return notes
}

// maxNotes bounds a result's notes, whatever makes them (a pipeline of
// many stages, an engine's adapter): the rest are counted in a last note.
const maxNotes = 100

func boundNotes(notes []string) []string {
	if len(notes) <= maxNotes {
		return notes
	}
	return append(notes[:maxNotes-1:maxNotes-1], fmt.Sprintf("and %d more notes", len(notes)-(maxNotes-1)))
}

// maxNamedNotes is how many tensors outside the contract the notes name
// one by one; the rest are counted in one note, so that a header of a
// million stray tensors cannot make a result of a million notes.
const maxNamedNotes = 20

// split sorts a capture's tensors (names under prefix) into the kernel's
// inputs and outputs; anything else is noted and ignored.
func split(k kernel.Kernel, tensors map[string]*tensor.Tensor, prefix string) (in, out map[string]*tensor.Tensor, notes []string) {
	in, out = map[string]*tensor.Tensor{}, map[string]*tensor.Tensor{}
	known := map[string]bool{}
	for _, s := range k.Spec().Inputs {
		known[s.Name] = true
		if t, ok := tensors[prefix+s.Name]; ok {
			in[s.Name] = t
		}
	}
	for _, s := range k.Spec().Outputs {
		known[s.Name] = true
		if t, ok := tensors[prefix+s.Name]; ok {
			out[s.Name] = t
		}
	}
	if prefix == "" {
		var extra []string
		for name := range tensors {
			if !known[name] {
				extra = append(extra, name)
			}
		}
		sort.Strings(extra)
		for _, name := range extra[:min(len(extra), maxNamedNotes)] {
			notes = append(notes, fmt.Sprintf("tensor %s is not part of the %s contract: ignored", name, k.Spec().Name))
		}
		if more := len(extra) - maxNamedNotes; more > 0 {
			notes = append(notes, fmt.Sprintf("and %d more tensors are not part of the %s contract: ignored", more, k.Spec().Name))
		}
	}
	return in, out, notes
}

func specNames(specs []kernel.TensorSpec) string {
	n := make([]string, len(specs))
	for i, s := range specs {
		n[i] = s.Name
	}
	return strings.Join(n, ", ")
}

// inputAnomalies reports NaN and Inf in float inputs where the kernel reads
// them and the contract gives them no meaning: kernels must carry them
// through, so they are not an error, but a reader of the report must know
// they were there. A note must mean something, so the entries of a paged
// cache that no request attends (poisoned with NaN by engines and by
// kcheck's own generator, on purpose) and the -inf of an empty split's
// partial lse are left out (kernel.TensorSpec's Read and Meaningful). The
// scan stops between chunks once ctx is done, and its notes are then of
// part of the inputs: Run returns the timeout instead.
func inputAnomalies(ctx context.Context, k kernel.Kernel, in kernel.Inputs) []string {
	var notes []string
	for _, s := range k.Spec().Inputs {
		t, ok := in.Tensors[s.Name]
		if !ok || !t.DType.IsFloat() || t.Check() != nil {
			continue
		}
		read := func(int) bool { return true }
		if s.Read != nil {
			r, err := s.Read(in)
			if err != nil {
				continue // the reference refuses these inputs and says why
			}
			read = r
		}
		if a := scanAnomalies(ctx, t, s, read); a.nan+a.inf > 0 {
			notes = append(notes, fmt.Sprintf("input anomaly: tensor %s holds %d NaN and %d Inf (first at %v)", s.Name, a.nan, a.inf, tensor.Unravel(a.first, t.Shape)))
		}
	}
	return notes
}

// anomalyChunk is how many elements one goroutine scans at a time: fixed,
// so the chunks, and their merge in order, are the same whatever
// GOMAXPROCS.
const anomalyChunk = 1 << 16

// anomalies is what a scan found: the counts and the first flat index
// (-1: none).
type anomalies struct{ nan, inf, first int }

// scanAnomalies counts the elements of t that spec s calls anomalous and
// the kernel reads, scanning t's bits in parallel chunks merged in chunk
// order. read is asked only about the special elements, as the serial
// scan through Float64At did. No chunk starts once ctx is done.
func scanAnomalies(ctx context.Context, t *tensor.Tensor, s kernel.TensorSpec, read func(int) bool) anomalies {
	n := t.Len()
	chunks := make([]anomalies, (n+anomalyChunk-1)/anomalyChunk)
	_ = parallel.Each(ctx, len(chunks), func(c int) {
		a := anomalies{first: -1}
		t.ScanSpecial(c*anomalyChunk, min((c+1)*anomalyChunk, n), func(i int, sp tensor.Special) {
			if !s.Anomalous(sp.Value()) || !read(i) {
				return
			}
			if sp == tensor.NaN {
				a.nan++
			} else {
				a.inf++
			}
			if a.first < 0 {
				a.first = i
			}
		})
		chunks[c] = a
	})
	all := anomalies{first: -1}
	for _, a := range chunks {
		all.nan += a.nan
		all.inf += a.inf
		if all.first < 0 {
			all.first = a.first
		}
	}
	return all
}

// compareOutputs runs the reference on in and compares each captured
// output; it returns the reference's outputs too, for a pipeline's chain.
func compareOutputs(k kernel.Kernel, in kernel.Inputs, prec kernel.Precision, outs map[string]*tensor.Tensor, opts Options) ([]compare.Check, []kernel.Output, error) {
	for name, t := range outs {
		if err := t.Check(); err != nil {
			return nil, nil, fmt.Errorf("tensor %s: %v", name, err)
		}
	}
	for name, t := range in.Tensors {
		if err := t.Check(); err != nil {
			return nil, nil, fmt.Errorf("tensor %s: %v", name, err)
		}
	}
	dtypes, in := outputLayout(in, outs)
	if err := opts.interrupted(); err != nil {
		return nil, nil, err
	}
	if err := CheckKernelMemory(k.Spec().Name, inputsAndOutputs(in.Tensors, outs), in.Params, opts.MaxMemory); err != nil {
		return nil, nil, err
	}
	refs, err := kernel.Evaluate(opts.context(), k, in, prec, dtypes)
	if err != nil {
		return nil, nil, opts.stopped(err)
	}
	var checks []compare.Check
	for _, spec := range k.Spec().Outputs {
		actual, ok := outs[spec.Name]
		if !ok {
			continue
		}
		var ref *kernel.Output
		for i := range refs {
			if refs[i].Name == spec.Name {
				ref = &refs[i]
			}
		}
		if ref == nil {
			continue
		}
		if err := kernel.CheckDType(spec.Name, actual, spec.DTypes...); err != nil {
			return nil, nil, err
		}
		if !sameShape(ref.Shape, actual.Shape) {
			return nil, nil, fmt.Errorf("tensor %s has shape %v; the inputs make it %v", spec.Name, actual.Shape, ref.Shape)
		}
		// A flat capture of a multi-dimensional output (swizzled scales
		// stored as [M_pad*K_pad]) is read in the reference's shape.
		actual = &tensor.Tensor{DType: actual.DType, Shape: ref.Shape, Data: actual.Data}
		c, err := compare.Compare(*ref, actual, opts.policy(), compare.Options{WorstK: opts.worstK(), Context: opts.ctx, Profile: opts.Observe != nil, ElementPath: opts.ElementPath})
		if err != nil {
			return nil, nil, opts.stopped(err)
		}
		opts.observe(k, in.Params, ref, actual, c)
		c.Profile = nil // the observer's: a result holds no profile
		checks = append(checks, c)
	}
	return checks, refs, nil
}

// outputLayout returns the dtype of each captured output and in with their
// shapes: the reference rounds to the dtypes the kernel under test stored
// and reads a size only the outputs give (S of mla_decode's partials).
func outputLayout(in kernel.Inputs, outs map[string]*tensor.Tensor) (map[string]tensor.DType, kernel.Inputs) {
	dtypes := map[string]tensor.DType{}
	in.OutputShapes = map[string][]int{}
	for name, t := range outs {
		dtypes[name] = t.DType
		in.OutputShapes[name] = t.Shape
	}
	return dtypes, in
}

// inputsAndOutputs adds the captured outputs to the inputs for the memory
// estimate, which reads the split count from partial_out's shape when no
// parameter gives it; an input of the same name wins.
func inputsAndOutputs(in, outs map[string]*tensor.Tensor) map[string]*tensor.Tensor {
	all := make(map[string]*tensor.Tensor, len(in)+len(outs))
	for name, t := range outs {
		all[name] = t
	}
	for name, t := range in {
		all[name] = t
	}
	return all
}

// sameShape compares shapes, treating [] and [1] alike and allowing a flat
// form of the same element count for Bitwise byte layouts.
func sameShape(a, b []int) bool {
	if tensor.NumElements(a) != tensor.NumElements(b) {
		return false
	}
	if len(a) == len(b) {
		for i := range a {
			if a[i] != b[i] {
				return false
			}
		}
		return true
	}
	return len(a) <= 1 || len(b) <= 1
}
