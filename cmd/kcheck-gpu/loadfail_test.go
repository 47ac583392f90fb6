package main

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/cuda"
	"github.com/kcheck-dev/kcheck/internal/gpu"
)

func TestLoadFailure(t *testing.T) {
	jit := errors.New("cuModuleLoadDataEx: CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222): ptxas application ptx input, line 1; fatal: Unsupported .version 9.5")
	cases := []struct {
		name string
		err  error
		ok   bool
		want string
	}{
		{"jit", &cuda.LoadError{File: "ptx/nvfp4.ptx", CUDAError: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", Err: jit}, true,
			"kernel image not loadable (CUDA_ERROR_UNSUPPORTED_PTX_VERSION): loading ptx/nvfp4.ptx: cuModuleLoadDataEx"},
		{"wrapped", fmt.Errorf("mla_decode: %w", &cuda.LoadError{File: "x.cubin", CUDAError: "CUDA_ERROR_NO_BINARY_FOR_GPU", Err: errors.New("no binary")}), true,
			"(CUDA_ERROR_NO_BINARY_FOR_GPU)"},
		{"other", errors.New("kernel execution: CUDA_ERROR_ILLEGAL_ADDRESS (700)"), false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			code, ok := loadFailure(&stderr, c.err)
			if ok != c.ok {
				t.Fatalf("ok = %v, want %v", ok, c.ok)
			}
			if ok && code != gpu.ExitLoad {
				t.Errorf("exit %d, want %d (gpu.ExitLoad)", code, gpu.ExitLoad)
			}
			if !strings.Contains(stderr.String(), c.want) {
				t.Errorf("stderr %q lacks %q", stderr.String(), c.want)
			}
		})
	}
}

// Which module-load results are the image's fault: a sticky error of an
// earlier launch is not.
func TestIsImageError(t *testing.T) {
	for name, want := range map[string]bool{
		"CUDA_ERROR_INVALID_PTX": true, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": true, "CUDA_ERROR_NO_BINARY_FOR_GPU": true,
		"CUDA_ERROR_INVALID_IMAGE": true, "CUDA_ERROR_ILLEGAL_ADDRESS": false, "CUDA_ERROR_OUT_OF_MEMORY": false,
	} {
		if got := cuda.IsImageError(name); got != want {
			t.Errorf("IsImageError(%s) = %v, want %v", name, got, want)
		}
	}
}
