//go:build !cuda && !cudaemu

package main

import (
	"fmt"
	"os"

	"github.com/kcheck-dev/kcheck/internal/gpu"
)

func main() {
	fmt.Fprintln(os.Stderr, "kcheck-gpu: built without the cuda tag; build it with `make gpu-bundle` or `go build -tags cuda ./cmd/kcheck-gpu` (needs the CUDA driver library)")
	os.Exit(gpu.ExitNoCUDABuild)
}
