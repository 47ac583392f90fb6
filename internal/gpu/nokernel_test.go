package gpu

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/cuda"
	"github.com/kcheck-dev/kcheck/internal/kernel"
)

// A kernel the CUDA side will never implement (a KV transfer is a copy,
// not a kernel) is refused with the reason before any worker is looked
// for; a kernel it implements goes on to the worker (here: none found).
func TestCUDARefusesKernelsItNeverImplements(t *testing.T) {
	for name := range cuda.NoKernel {
		if _, err := kernel.Lookup(name); err != nil {
			t.Errorf("cuda.NoKernel names %s: %v", name, err)
		}
		if _, ok := cuda.Precisions[name]; ok {
			t.Errorf("%s is both implemented and refused", name)
		}
	}
	for _, tc := range []struct {
		kernel string
		status Status
		want   string
	}{
		{"kv_cache_transfer", StatusUnsupported, "is a byte copy between their caches"},
		{"kv_cache_write", StatusUnavailable, "nowhere/kcheck-gpu"},
	} {
		b := &Backend{Worker: &Worker{Path: "/nowhere/kcheck-gpu", Find: func() (string, error) { return "", errors.New("no worker") }}}
		_, err := b.Run(context.Background(), tc.kernel, kernel.Inputs{Params: kernel.Params{}})
		var re *RunError
		if !errors.As(err, &re) || re.Info.Status != tc.status || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("cuda run of %s: %v, want status %s saying %q", tc.kernel, err, tc.status, tc.want)
		}
	}
}
