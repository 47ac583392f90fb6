package check

import (
	"bytes"
	"fmt"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"strings"

	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// stage is one resolved pipeline stage.
type stage struct {
	prefix string
	k      kernel.Kernel
	params kernel.Params
	prec   kernel.Precision
	links  map[string]string // input name -> "<earlier prefix>.<tensor>"
}

// parseStages reads kcheck.stages and each stage's kernel, params and links
// (reference/CONTRACTS.md §4), in time linear in the metadata: every key is walked
// once through a trie of the stage prefixes (a capture of 100,000 stages
// used to take a quarter of an hour, each stage scanning every key).
func parseStages(meta map[string]string) ([]stage, error) {
	list, ok := meta["kcheck.stages"]
	if !ok || strings.TrimSpace(list) == "" {
		return nil, fmt.Errorf("metadata kcheck.stages is missing: a pipeline must list its stages")
	}
	prefixes := strings.Split(list, ",")
	bad := -1 // the first empty or repeated prefix, reported in its turn
	index := map[string]int{}
	trie := &prefixNode{}
	for i, prefix := range prefixes {
		prefix = strings.TrimSpace(prefix)
		prefixes[i] = prefix
		if _, seen := index[prefix]; prefix == "" || seen {
			bad = i
			break
		}
		index[prefix] = i
		trie.insert(prefix, i)
	}
	params := make([]kernel.Params, len(prefixes))
	links := make([]map[string]string, len(prefixes))
	for i := range params {
		params[i], links[i] = kernel.Params{}, map[string]string{}
	}
	for key, v := range meta {
		// A key <prefix>.<param> is a parameter of every stage whose prefix
		// it starts with (s0 and s0.cache both see s0.cache.page_size).
		trie.each(key, func(i int, param string) { params[i][param] = v })
		if rest, ok := strings.CutPrefix(key, "kcheck."); ok {
			trie.each(rest, func(i int, tail string) {
				if input, ok := strings.CutPrefix(tail, "from."); ok {
					links[i][input] = v
				}
			})
		}
	}
	var stages []stage
	for i, prefix := range prefixes {
		if i == bad {
			return nil, fmt.Errorf("metadata kcheck.stages = %q: stage prefix %q is empty or repeated", list, prefix)
		}
		kname := meta["kcheck."+prefix+".kernel"]
		if kname == "" {
			return nil, fmt.Errorf("metadata kcheck.%s.kernel is missing: stage %s does not say its kernel", prefix, prefix)
		}
		k, err := kernel.Lookup(kname)
		if err != nil {
			return nil, fmt.Errorf("metadata kcheck.%s.kernel: %v", prefix, err)
		}
		st := stage{prefix: prefix, k: k, params: params[i], links: links[i]}
		if st.prec, err = kernel.PrecisionFrom(st.params); err != nil {
			return nil, fmt.Errorf("stage %s: %v", prefix, err)
		}
		stages = append(stages, st)
	}
	// A link must name an earlier stage's output.
	for i, st := range stages {
		for input, src := range st.links {
			if !hasInput(st.k, input) {
				return nil, fmt.Errorf("metadata kcheck.%s.from.%s: %s has no input %s", st.prefix, input, st.k.Spec().Name, input)
			}
			dot := strings.LastIndex(src, ".")
			if dot <= 0 {
				return nil, fmt.Errorf("metadata kcheck.%s.from.%s = %q: want <earlier stage>.<tensor>", st.prefix, input, src)
			}
			srcPrefix, srcTensor := src[:dot], src[dot+1:]
			j, ok := index[srcPrefix]
			if !ok || j >= i {
				return nil, fmt.Errorf("metadata kcheck.%s.from.%s = %q: %s is not an earlier stage", st.prefix, input, src, srcPrefix)
			}
			if earlier := stages[j]; !hasOutput(earlier.k, srcTensor) {
				return nil, fmt.Errorf("metadata kcheck.%s.from.%s = %q: stage %s (%s) has no output %s", st.prefix, input, src, srcPrefix, earlier.k.Spec().Name, srcTensor)
			}
		}
	}
	return stages, nil
}

// prefixNode is a trie of stage prefixes by their dot-separated segments,
// so that the prefixes a key starts with are found in one walk of the key.
type prefixNode struct {
	stage int // 1 + the index of the stage with this prefix; 0: none
	next  map[string]*prefixNode
}

func (n *prefixNode) insert(prefix string, stage int) {
	for _, seg := range strings.Split(prefix, ".") {
		child := n.next[seg]
		if child == nil {
			if n.next == nil {
				n.next = map[string]*prefixNode{}
			}
			child = &prefixNode{}
			n.next[seg] = child
		}
		n = child
	}
	n.stage = stage + 1
}

// each calls fn(stage, rest) for every stage whose prefix p makes key
// p + "." + rest, shortest prefix first.
func (n *prefixNode) each(key string, fn func(stage int, rest string)) {
	for i := 0; ; {
		j := strings.IndexByte(key[i:], '.')
		if j < 0 {
			return
		}
		if n = n.next[key[i:i+j]]; n == nil {
			return
		}
		i += j + 1
		if n.stage > 0 {
			fn(n.stage-1, key[i:])
		}
	}
}

func hasInput(k kernel.Kernel, name string) bool {
	for _, s := range k.Spec().Inputs {
		if s.Name == name {
			return true
		}
	}
	return false
}

func hasOutput(k kernel.Kernel, name string) bool {
	for _, s := range k.Spec().Outputs {
		if s.Name == name {
			return true
		}
	}
	return false
}

func specOf(k kernel.Kernel, name string) kernel.TensorSpec {
	for _, s := range k.Spec().Inputs {
		if s.Name == name {
			return s
		}
	}
	return kernel.TensorSpec{Name: name}
}

// fitLink reshapes a linked tensor to what the consumer expects: the
// consumer's own stored copy's shape when there is one, else the
// contract's rank by flattening leading dimensions. Element counts must agree.
func fitLink(src *tensor.Tensor, spec kernel.TensorSpec, stored *tensor.Tensor, name string) (*tensor.Tensor, error) {
	want := src.Shape
	switch {
	case stored != nil:
		want = stored.Shape
	case spec.Rank > 0 && len(src.Shape) > spec.Rank:
		lead := tensor.NumElements(src.Shape[:len(src.Shape)-spec.Rank+1])
		want = append([]int{lead}, src.Shape[len(src.Shape)-spec.Rank+1:]...)
	}
	if tensor.NumElements(want) != src.Len() {
		return nil, fmt.Errorf("link into %s: shape %v cannot be read as %v (element counts differ)", name, src.Shape, want)
	}
	return &tensor.Tensor{DType: src.DType, Shape: want, Data: src.Data}, nil
}

// stageInputs gathers a stage's inputs: its own stored tensors, and linked
// inputs taken from outputs (captured ones for the local check, the
// reference chain's for the propagated one).
func stageInputs(st stage, captured map[string]*tensor.Tensor, outputs map[string]*tensor.Tensor) (map[string]*tensor.Tensor, error) {
	in := map[string]*tensor.Tensor{}
	for _, s := range st.k.Spec().Inputs {
		stored := captured[st.prefix+"."+s.Name]
		src, linked := st.links[s.Name]
		if !linked {
			if stored != nil {
				in[s.Name] = stored
			}
			continue
		}
		from, ok := outputs[src]
		if !ok {
			return nil, fmt.Errorf("stage %s: input %s links to %s, which the file does not hold", st.prefix, s.Name, src)
		}
		fitted, err := fitLink(from, s, stored, st.prefix+"."+s.Name)
		if err != nil {
			return nil, err
		}
		in[s.Name] = fitted
	}
	return in, nil
}

func runPipeline(c evidence.Capture, meta map[string]string, opts Options) Result {
	stages, err := parseStages(meta)
	if err != nil {
		return errorResult(c.Name, "pipeline", err)
	}
	res := Result{File: c.Name, Kernel: "pipeline", Policy: opts.policy().Name(), Checks: []compare.Check{}}
	// A linked input stored under the consumer's name must equal its source.
	for _, st := range stages {
		for input, src := range st.links {
			stored, ok := c.Tensors[st.prefix+"."+input]
			from, ok2 := c.Tensors[src]
			if ok && ok2 && (stored.DType != from.DType || !bytes.Equal(stored.Data, from.Data)) {
				return errorResult(c.Name, "pipeline", fmt.Errorf("tensor %s.%s is linked to %s but holds different data", st.prefix, input, src))
			}
		}
	}
	chain := map[string]*tensor.Tensor{} // reference chain outputs, by "<prefix>.<tensor>"
	var culprit *string
	var verdicts []compare.Verdict
	for _, st := range stages {
		if err := opts.interrupted(); err != nil {
			return errorResult(c.Name, "pipeline", fmt.Errorf("before stage %s: %w", st.prefix, err))
		}
		sr := StageResult{Prefix: st.prefix, Kernel: st.k.Spec().Name, Stage: st.k.Spec().Stage, Local: []compare.Check{}}
		_, outs, _ := split(st.k, c.Tensors, st.prefix+".")
		// The reference runs once per set of inputs: on the captured ones
		// (local), and, for a stage linked to earlier ones, on the chain's
		// (propagated). The chain goes on with the outputs of the last.
		var chainRefs []kernel.Output
		local, err := stageInputs(st, c.Tensors, c.Tensors)
		if err == nil {
			sr.Local, chainRefs, err = compareOutputs(st.k, kernel.Inputs{Tensors: local, Params: st.params}, st.prec, outs, opts.forStage(st.prefix, "local"))
			res.Notes = append(res.Notes, outputNotes("stage "+st.prefix+": ", chainRefs, outs)...)
		}
		if err == nil && len(st.links) > 0 {
			var prop map[string]*tensor.Tensor
			if prop, err = stageInputs(st, c.Tensors, chain); err == nil {
				sr.Propagated, chainRefs, err = compareOutputs(st.k, kernel.Inputs{Tensors: prop, Params: st.params}, st.prec, outs, opts.forStage(st.prefix, "propagated"))
			}
		}
		if err == nil {
			for _, o := range chainRefs {
				if chain[st.prefix+"."+o.Name], err = kernel.MaterializeContext(opts.context(), o.DType, o.Shape, o.Expected); err != nil {
					err = opts.stopped(err)
					break
				}
			}
		}
		if err != nil {
			return errorResult(c.Name, "pipeline", fmt.Errorf("stage %s (%s): %w", st.prefix, st.k.Spec().Name, err))
		}
		if len(outs) == 0 {
			sr.Verdict = Inconclusive
			res.Notes = append(res.Notes, fmt.Sprintf("stage %s stores none of its outputs: not checked", st.prefix))
		} else {
			sr.Verdict = compare.FileVerdict(sr.Local)
		}
		if sr.Verdict == Fail && culprit == nil {
			p := st.prefix
			culprit = &p
		}
		verdicts = append(verdicts, compare.Verdict(sr.Verdict))
		res.Stages = append(res.Stages, sr)
		res.Checks = append(res.Checks, prefixed(st.prefix, sr.Local)...)
	}
	res.Stage = culprit
	res.Verdict = compare.Combine(verdicts...)
	return res
}

func prefixed(prefix string, checks []compare.Check) []compare.Check {
	out := make([]compare.Check, len(checks))
	for i, c := range checks {
		c.Tensor = prefix + "." + c.Tensor
		out[i] = c
	}
	return out
}
