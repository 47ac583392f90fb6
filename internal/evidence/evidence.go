// Package evidence is what kcheck judges: a capture of one kernel call (or
// of a pipeline's stages), its input and output tensors with the metadata
// that says which kernel ran, with what parameters, where and on what.
// Assemble is the one way to put one together, whoever produced the
// outputs (a backend run on a case's inputs, an engine's hook, the GPU
// worker); internal/check reads and judges them.
package evidence

import "github.com/kcheck-dev/kcheck/reference/tensor"

// Capture is an evidence file in memory.
type Capture struct {
	Name     string
	Metadata map[string]string
	Tensors  map[string]*tensor.Tensor
	// Notes are what reading it decided (the dtype of a numpy array of
	// bits); the result carries them.
	Notes []string
}

// Assemble makes the capture named name of a kernel call: the inputs and
// the outputs (an output wins over an input of the same name: what the
// kernel wrote), and the metadata layers in order, a later one winning (the
// case's parameters and provenance, then what the backend says of its
// run). The maps given are not modified, nor kept: the capture's are its
// own, holding the same tensors.
func Assemble(name string, inputs, outputs map[string]*tensor.Tensor, meta ...map[string]string) Capture {
	c := Capture{Name: name, Metadata: map[string]string{}, Tensors: make(map[string]*tensor.Tensor, len(inputs)+len(outputs))}
	for _, m := range meta {
		for k, v := range m {
			c.Metadata[k] = v
		}
	}
	for k, v := range inputs {
		c.Tensors[k] = v
	}
	for k, v := range outputs {
		c.Tensors[k] = v
	}
	return c
}
