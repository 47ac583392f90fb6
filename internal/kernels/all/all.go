// Package all imports every kernel family, so that each registers itself,
// its kernels and its planted faults: the one list of kcheck's kernels and
// of the fault catalog. A program or test that looks kernels or faults up
// by name (the faulty backend included) imports it for its side effect.
package all

import (
	_ "github.com/kcheck-dev/kcheck/internal/kernels/dsa"
	_ "github.com/kcheck-dev/kcheck/internal/kernels/kvcache"
	_ "github.com/kcheck-dev/kcheck/internal/kernels/mla"
	_ "github.com/kcheck-dev/kcheck/internal/kernels/nvfp4"
	_ "github.com/kcheck-dev/kcheck/internal/kernels/splitk"
	_ "github.com/kcheck-dev/kcheck/internal/kernels/transfer"
)
