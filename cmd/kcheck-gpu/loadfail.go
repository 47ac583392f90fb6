package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/kcheck-dev/kcheck/cuda"
	"github.com/kcheck-dev/kcheck/internal/gpu"
)

// loadFailure reports a kernel image the driver refused (a *cuda.LoadError:
// the PTX JIT failed, or an image with nothing for this GPU) with its own
// exit status, before the generic CUDA error that a kernel crash gets. It
// carries no build tag so that this mapping is tested without a GPU.
func loadFailure(stderr io.Writer, err error) (code int, ok bool) {
	var le *cuda.LoadError
	if !errors.As(err, &le) {
		return 0, false
	}
	fmt.Fprintf(stderr, "kcheck-gpu: kernel image not loadable (%s): %v\n", le.CUDAError, err)
	return gpu.ExitLoad, true
}
