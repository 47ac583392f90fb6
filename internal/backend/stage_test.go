package backend_test

import (
	"context"
	"strings"
	"testing"

	. "github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// called records whether a run reached it, so a test can tell the base
// from the reference without building real inputs.
type called struct{ ran *bool }

func (called) Name() string { return "base" }

func (c called) Run(ctx context.Context, name string, in kernel.Inputs) (map[string]*tensor.Tensor, error) {
	*c.ran = true
	return map[string]*tensor.Tensor{}, nil
}

// A swap is only a diagnosis if it moves exactly the named stage: a stage
// left on the base (or another moved with it) would blame the wrong one.
func TestSwappedAndOnlyRouteByStage(t *testing.T) {
	stages := []string{kernel.StageQuant, kernel.StageCache, kernel.StageAttn, kernel.StageCombine}
	for _, k := range kernel.All() {
		name, own := k.Spec().Name, k.Spec().Stage
		for _, stage := range stages {
			for _, tc := range []struct {
				be       func(Backend) Backend
				wantBase bool // the base runs it (else the reference does)
			}{
				{func(b Backend) Backend { return Swapped{Base: b, Stage: stage} }, own != stage},
				{func(b Backend) Backend { return Only{Base: b, Stage: stage} }, own == stage},
			} {
				var ran bool
				be := tc.be(called{&ran})
				// Empty inputs: the reference refuses them with an
				// error, the base records that it was asked.
				_, _ = be.Run(context.Background(), name, kernel.Inputs{})
				if ran != tc.wantBase {
					t.Errorf("%s on %s (stage %s): base ran %v, want %v", be.Name(), name, own, ran, tc.wantBase)
				}
			}
		}
	}
}

func TestStageBackendsNameTheirParts(t *testing.T) {
	var ran bool
	for _, tc := range []struct {
		be   Backend
		want string
	}{
		{Swapped{Base: called{&ran}, Stage: kernel.StageCache}, "base with cache on the reference"},
		{Only{Base: called{&ran}, Stage: kernel.StageAttn}, "base in attn only"},
		{Exact{}, "exact"},
	} {
		if got := tc.be.Name(); got != tc.want {
			t.Errorf("Name() = %q, want %q", got, tc.want)
		}
	}
}

// An unknown kernel is an error naming it, from every one of them, and
// reaches no base.
func TestStageBackendsRefuseAnUnknownKernel(t *testing.T) {
	var ran bool
	for _, be := range []Backend{Swapped{Base: called{&ran}, Stage: kernel.StageCache}, Only{Base: called{&ran}, Stage: kernel.StageCache}, Exact{}} {
		_, err := be.Run(context.Background(), "no_such_kernel", kernel.Inputs{})
		if err == nil || !strings.Contains(err.Error(), "no_such_kernel") {
			t.Errorf("%s: error %v; want one naming no_such_kernel", be.Name(), err)
		}
	}
	if ran {
		t.Error("an unknown kernel reached the base")
	}
}
