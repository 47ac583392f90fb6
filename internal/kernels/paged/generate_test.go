package paged_test

import (
	"bytes"
	"context"
	"slices"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/kernel"
	_ "github.com/kcheck-dev/kcheck/internal/kernels/all"
	"github.com/kcheck-dev/kcheck/internal/kernels/paged"
)

// TestCacheFromTheMemoIsTheBuild: under a memo, every cache Cache gives,
// hit or build, is the cache, paging and k_scale it gives without one, and
// leaves the generator where that build leaves it; a hit is a copy, which
// its caller may change without changing the next. The cases differ in
// one thing each from the first (the RNG state, a dimension, the page
// size, the dtype, the contexts, a writer parameter), so a key that left
// one out would serve a wrong cache.
func TestCacheFromTheMemoIsTheBuild(t *testing.T) {
	base := kernel.Geometry{Latent: 64, Rope: 16, PageSize: 4, KVCacheDType: "bf16"}
	type build struct {
		name    string
		seed    uint64
		g       kernel.Geometry
		seqLens []int
		params  kernel.Params
	}
	with := func(f func(*kernel.Geometry)) kernel.Geometry { g := base; f(&g); return g }
	builds := []build{
		{"first", 1, base, []int{5, 9}, nil},
		{"again", 1, base, []int{5, 9}, nil},
		{"seed", 2, base, []int{5, 9}, nil},
		{"latent", 1, with(func(g *kernel.Geometry) { g.Latent = 32 }), []int{5, 9}, nil},
		{"rope", 1, with(func(g *kernel.Geometry) { g.Rope = 8 }), []int{5, 9}, nil},
		{"page", 1, with(func(g *kernel.Geometry) { g.PageSize = 2 }), []int{5, 9}, nil},
		{"dtype", 1, with(func(g *kernel.Geometry) { g.KVCacheDType = "fp8_e4m3" }), []int{5, 9}, nil},
		{"contexts", 1, base, []int{9, 5}, nil},
		{"ds_mla_scale", 1, with(func(g *kernel.Geometry) { g.Latent, g.Rope, g.KVCacheDType = 512, 64, "fp8_ds_mla" }), []int{5}, kernel.Params{"ds_mla_scale": "pow2"}},
		{"ds_mla_scale amax", 1, with(func(g *kernel.Geometry) { g.Latent, g.Rope, g.KVCacheDType = 512, 64, "fp8_ds_mla" }), []int{5}, kernel.Params{"ds_mla_scale": "amax"}},
		{"first once more", 1, base, []int{5, 9}, nil},
	}
	memo := kernel.NewMemo(1 << 30)
	ctx := kernel.WithMemo(context.Background(), memo)
	for _, b := range builds {
		r, rm := kernel.NewRNG(b.seed, 1), kernel.NewRNG(b.seed, 1)
		want, wpg, wks, err := paged.Cache(context.Background(), r, b.g, b.seqLens, b.params)
		if err != nil {
			t.Fatalf("%s: %v", b.name, err)
		}
		got, gpg, gks, err := paged.Cache(ctx, rm, b.g, b.seqLens, b.params)
		if err != nil {
			t.Fatalf("%s under the memo: %v", b.name, err)
		}
		if got.DType != want.DType || !slices.Equal(got.Shape, want.Shape) || !bytes.Equal(got.Data, want.Data) {
			t.Errorf("%s: the cache under the memo differs from the build's", b.name)
		}
		if gpg.NB != wpg.NB || gpg.MaxBlocks != wpg.MaxBlocks || !slices.Equal(gpg.Table, wpg.Table) || gks != wks {
			t.Errorf("%s: paging %+v and k_scale %v under the memo; the build's %+v and %v", b.name, gpg, gks, wpg, wks)
		}
		if a, b2 := r.Normal(), rm.Normal(); a != b2 {
			t.Errorf("%s: the next draw after the memo's cache is %v; after the build, %v", b.name, b2, a)
		}
		// the caller's copy is its own: spoil it, and the next hit of
		// this key must still be the build's
		clear(got.Data)
		clear(gpg.Table)
	}
	if memo.Hits() != 2 { // "again" and "first once more"
		t.Errorf("%d caches came from the memo, want 2", memo.Hits())
	}
}

// TestCacheTooLargeForTheMemo: a cache over the memo's budget is built
// (and is the build's) but not kept, and a build stopped by its context
// returns the error and keeps nothing.
func TestCacheTooLargeForTheMemo(t *testing.T) {
	g := kernel.Geometry{Latent: 64, Rope: 16, PageSize: 4, KVCacheDType: "bf16"}
	memo := kernel.NewMemo(100) // bytes: under any cache
	ctx := kernel.WithMemo(context.Background(), memo)
	for range 2 {
		if _, _, _, err := paged.Cache(ctx, kernel.NewRNG(1, 1), g, []int{5, 9}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if memo.Hits() != 0 {
		t.Errorf("%d caches over the budget came from the memo", memo.Hits())
	}
	stopped, cancel := context.WithCancel(kernel.WithMemo(context.Background(), kernel.NewMemo(1<<30)))
	cancel()
	if c, _, _, err := paged.Cache(stopped, kernel.NewRNG(1, 1), g, []int{5, 9}, nil); err == nil || c != nil {
		t.Errorf("a stopped build gave %v, %v; want its context's error", c, err)
	}
}
