package transfer

import (
	"context"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/backend"
	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
	"github.com/kcheck-dev/kcheck/internal/evidence"
	"github.com/kcheck-dev/kcheck/internal/faults"
	. "github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/internal/signature"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// small is a transfer case of two requests (one past a page boundary, one
// inside its first page) over the decode side's pages of 16.
func small(dst, src string, srcPage int, params map[string]string) cases.Case {
	p := map[string]string{"src_kv_cache_dtype": src}
	if srcPage > 0 {
		p["src_page_size"] = strconv.Itoa(srcPage)
	}
	maps.Copy(p, params)
	c := cases.Case{Name: "test/kv_cache_transfer", Kernel: "kv_cache_transfer", KVCacheDType: dst, PageSize: 16,
		SeqLens: []int{37, 9}, Seed: 160, Params: p}
	if dst != "fp8_ds_mla" && src != "fp8_ds_mla" {
		c.Latent, c.Rope = 32, 16
	}
	return c
}

// captureOf is the case's inputs with the reference's (or edit's) outputs,
// as a capture `kcheck check` reads.
func captureOf(t *testing.T, c cases.Case, edit func(in Inputs, out map[string]*tensor.Tensor)) evidence.Capture {
	t.Helper()
	in, err := c.Inputs()
	if err != nil {
		t.Fatal(err)
	}
	meta, err := c.Metadata()
	if err != nil {
		t.Fatal(err)
	}
	capt, err := backend.Capture(context.Background(), backend.Reference{}, c.Name, c.Kernel, in, meta)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		out := map[string]*tensor.Tensor{"dst_cache_after": capt.Tensors["dst_cache_after"].Clone()}
		edit(in, out)
		capt.Tensors["dst_cache_after"] = out["dst_cache_after"]
	}
	return capt
}

// movedEntry returns the flat element range of request b's token t's
// decode-side entry.
func movedEntry(in Inputs, b, t int) (lo, hi int) {
	dst, bt := in.Tensors["dst_cache_before"], in.Tensors["dst_block_table"]
	p, e := dst.Shape[1], dst.Shape[2]
	slot := int(bt.Int64At(b*bt.Shape[1]+t/p))*p + t%p
	return slot * e, (slot + 1) * e
}

// Every layout pair passes as the reference writes it, and fails with one
// byte of one token changed, or one byte no token owns: the check has
// teeth both ways (a token's entry, and "every other byte unchanged").
func TestTransferChecks(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    cases.Case
	}{
		{"bf16 to bf16, equal pages", small("bf16", "bf16", 0, nil)},
		{"bf16 pages of 4 to pages of 16", small("bf16", "bf16", 4, nil)},
		{"bf16 pages of 64 to pages of 16", small("bf16", "bf16", 64, nil)},
		{"fp8_e4m3 to fp8_e4m3", small("fp8_e4m3", "fp8_e4m3", 0, nil)},
		{"bf16 to fp8_e4m3 (converted)", small("fp8_e4m3", "bf16", 0, nil)},
		{"fp8_e4m3 to bf16 (converted)", small("bf16", "fp8_e4m3", 1, nil)},
		{"bf16 to fp8_ds_mla (converted)", small("fp8_ds_mla", "bf16", 64, nil)},
		{"fp8_ds_mla amax to pow2 (converted)", small("fp8_ds_mla", "fp8_ds_mla", 0, map[string]string{"src_ds_mla_scale": "amax", "ds_mla_scale": "pow2"})},
		{"fp8_ds_mla pow2 to pow2", small("fp8_ds_mla", "fp8_ds_mla", 0, map[string]string{"ds_mla_scale": "pow2"})},
		{"whole pages", small("bf16", "bf16", 0, map[string]string{"whole_pages": "true"})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if r := check.Run(t.Context(), captureOf(t, tc.c, nil), check.Options{}); r.Verdict != check.Pass {
				t.Fatalf("the reference's transfer: verdict %s (%v)", r.Verdict, reasons(r))
			}
			flipToken := func(in Inputs, out map[string]*tensor.Tensor) {
				lo, _ := movedEntry(in, 0, 20)
				a := out["dst_cache_after"]
				a.Data[lo*a.DType.Size()] ^= 0x40
			}
			if r := check.Run(t.Context(), captureOf(t, tc.c, flipToken), check.Options{}); r.Verdict != check.Fail {
				t.Errorf("request 0 token 20's entry changed: verdict %s, want fail", r.Verdict)
			}
			stray := func(in Inputs, out map[string]*tensor.Tensor) {
				a := out["dst_cache_after"]
				// the decode cache's blocks no request uses: the generator's two spares
				used := map[int64]bool{}
				bt := in.Tensors["dst_block_table"]
				for i := 0; i < bt.Len(); i++ {
					used[bt.Int64At(i)] = true
				}
				for b := 0; b < a.Shape[0]; b++ {
					if !used[int64(b)] {
						a.Data[b*len(a.Data)/a.Shape[0]] ^= 0x01
						return
					}
				}
				t.Fatal("no spare block")
			}
			if r := check.Run(t.Context(), captureOf(t, tc.c, stray), check.Options{}); r.Verdict != check.Fail {
				t.Errorf("a byte no token owns changed: verdict %s, want fail", r.Verdict)
			}
		})
	}
}

func reasons(r check.Result) string {
	var s []string
	if r.Error != nil {
		s = append(s, *r.Error)
	}
	for _, c := range r.Checks {
		s = append(s, c.Tensor+": "+string(c.Verdict)+": "+c.Reason)
	}
	return strings.Join(s, "; ")
}

// Every bad input is an error naming the input and what is wrong with it.
func TestTransferBadInputs(t *testing.T) {
	base := small("bf16", "bf16", 0, nil)
	for _, tc := range []struct {
		name string
		edit func(in *Inputs)
		want string
	}{
		{"source block outside its cache", func(in *Inputs) { in.Tensors["src_block_table"] = setInt(in.Tensors["src_block_table"], 1, 9412) },
			"src_block_table[0,1] = 9412 is outside the cache"},
		{"decode block -1 in use", func(in *Inputs) { in.Tensors["dst_block_table"] = setInt(in.Tensors["dst_block_table"], 0, -1) },
			"dst_block_table[0,0] = -1 is outside the cache"},
		{"seq_len past the tables", func(in *Inputs) { in.Tensors["seq_lens"] = setInt(in.Tensors["seq_lens"], 1, 1000) },
			"seq_lens[1] = 1000 exceeds the src_block_table's capacity"},
		{"seq_lens of another batch", func(in *Inputs) {
			in.Tensors["seq_lens"] = tensor.FromInt64s(tensor.I32, []int{3}, []int64{1, 1, 1})
		}, "tensor seq_lens has 3 entries but src_block_table has 2 rows"},
		{"two requests on one decode block", func(in *Inputs) {
			bt := in.Tensors["dst_block_table"]
			in.Tensors["dst_block_table"] = setInt(bt, bt.Shape[1], bt.Int64At(0))
		}, "two tokens would land in one decode-side entry"},
		{"whole pages of two sizes", func(in *Inputs) {
			in.Params["whole_pages"] = "true"
			in.Params["page_size"] = "8"
		}, "parameter page_size = 8 but tensor dst_cache_before has pages of 16 tokens"},
		{"src_page_size against the cache", func(in *Inputs) { in.Params["src_page_size"] = "64" },
			"parameter src_page_size = 64 but tensor src_cache has pages of 16 tokens"},
		{"an unknown source layout", func(in *Inputs) { in.Params["src_kv_cache_dtype"] = "fp4" },
			`parameter src_kv_cache_dtype = "fp4": want one of bf16, fp16, fp8_e4m3, fp8_ds_mla`},
		{"a source cache of another model", func(in *Inputs) {
			in.Tensors["src_cache"] = tensor.New(tensor.BF16, 5, 16, 40)
		}, "tensor src_cache has shape [5 16 40]: 40 values a token, where the other node's cache holds 48"},
		{"fp8 decode side without its scale", func(in *Inputs) {
			in.Params["kv_cache_dtype"] = "fp8_e4m3"
			in.Tensors["dst_cache_before"] = tensor.New(tensor.U8, in.Tensors["dst_cache_before"].Shape...)
		}, "tensor dst_k_scale is missing (kv_cache_dtype fp8_e4m3 of dst_cache_before divides by it)"},
		{"a zero scale", func(in *Inputs) {
			in.Params["src_kv_cache_dtype"] = "fp8_e4m3"
			in.Tensors["src_cache"] = tensor.New(tensor.U8, in.Tensors["src_cache"].Shape...)
			in.Tensors["src_k_scale"] = F32Scalar(0)
		}, "tensor src_k_scale = 0: want a positive finite scale"},
		{"a table of floats", func(in *Inputs) { in.Tensors["dst_block_table"] = tensor.New(tensor.F32, 2, 3) },
			"tensor dst_block_table has dtype F32; the contract wants I32 or I64"},
		{"a cache of rank 2", func(in *Inputs) { in.Tensors["dst_cache_before"] = tensor.New(tensor.BF16, 16, 48) },
			"tensor dst_cache_before has shape [16 48]; the contract wants [NB, P, entry]"},
		{"whole pages between layouts", func(in *Inputs) {
			in.Params["whole_pages"] = "true"
			in.Params["kv_cache_dtype"] = "fp8_e4m3"
			in.Tensors["dst_cache_before"] = tensor.New(tensor.U8, in.Tensors["dst_cache_before"].Shape...)
			in.Tensors["dst_k_scale"] = F32Scalar(0.01)
		}, "parameter whole_pages = true needs one layout on both sides, and src_cache is bf16 while dst_cache_before is fp8_e4m3 over k_scale 0.01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, err := base.Inputs()
			if err != nil {
				t.Fatal(err)
			}
			tc.edit(&in)
			k, _ := Lookup("kv_cache_transfer")
			_, err = Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// A whole-pages transfer between page sizes that differ is refused, with
// both sizes named.
func TestWholePagesNeedEqualPages(t *testing.T) {
	in, err := small("bf16", "bf16", 4, map[string]string{"whole_pages": "true"}).Inputs()
	if err != nil {
		t.Fatal(err)
	}
	k, _ := Lookup("kv_cache_transfer")
	_, err = Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	if want := "parameter whole_pages = true needs equal page sizes on both sides: src_page_size = 4, page_size = 16"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("got %v, want %q", err, want)
	}
}

func setInt(t *tensor.Tensor, i int, v int64) *tensor.Tensor {
	c := t.Clone()
	c.SetInt64(i, v)
	return c
}

// The suspects name patterns the signature declares.
func TestSuspectPatternsAreDeclared(t *testing.T) {
	in, err := small("fp8_e4m3", "bf16", 4, nil).Inputs()
	if err != nil {
		t.Fatal(err)
	}
	k, _ := Lookup("kv_cache_transfer")
	outs, err := Evaluate(context.Background(), k, in, DefaultPrecision(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range outs[0].Suspects {
		got = append(got, s.Pattern)
		if !slices.Contains(signature.SuspectPatterns, s.Pattern) {
			t.Errorf("suspect %q is not a pattern internal/signature declares (%v)", s.Pattern, signature.SuspectPatterns)
		}
		if s.Values.Len() != outs[0].Expected.Len() {
			t.Errorf("suspect %s: %d values for an output of %d", s.Pattern, s.Values.Len(), outs[0].Expected.Len())
		}
	}
	// bf16 pages of 4 into fp8_e4m3 pages of 16: the entries differ in
	// bytes, so no page-size suspect (it moves whole pages of bytes).
	if want := []string{"block_table_shift", "block_table_shift", "layout_mismatch", "partial_transfer"}; !slices.Equal(got, want) {
		t.Errorf("suspects %v, want %v", got, want)
	}
}

// Shrinking keeps a request's pages on both sides and what the transfer
// changed elsewhere: the sliced capture still checks as the whole did.
func TestTransferSlices(t *testing.T) {
	c := small("bf16", "bf16", 4, nil)
	for _, planted := range []bool{false, true} {
		capt := captureOf(t, c, func(in Inputs, out map[string]*tensor.Tensor) {
			if planted {
				lo, _ := movedEntry(in, 1, 3)
				out["dst_cache_after"].SetFloat64(lo, math.Pi)
			}
		})
		axes, ok := kernelTransfer{}.Axes(capt.Tensors, capt.Metadata)
		if !ok || len(axes) != 1 || axes[0].N != 2 {
			t.Fatalf("axes %v, %v", axes, ok)
		}
		repl, err := axes[0].Slice([]int{1})
		if err != nil {
			t.Fatal(err)
		}
		sliced := evidence.Capture{Name: "sliced", Metadata: capt.Metadata, Tensors: maps.Clone(capt.Tensors)}
		maps.Copy(sliced.Tensors, repl)
		want := check.Pass
		if planted {
			want = check.Fail
		}
		if r := check.Run(t.Context(), sliced, check.Options{}); r.Verdict != want {
			t.Errorf("planted=%v: request 1 alone: verdict %s, want %s (%v)", planted, r.Verdict, want, reasons(r))
		}
	}
}

// A converted entry may differ from the expected one only where another
// correct writer's would: 1.0625 / 1 sits exactly between the E4M3 codes of
// 1.0 (0x38, the even one the reference stores) and 1.125 (0x39), so a
// writer that divides through a reciprocal may store either; 1.25 (0x3A)
// no correct writer stores. 3.0 is exact: 0x44.
func TestConvertedTieIsExcused(t *testing.T) {
	meta := map[string]string{"kcheck.format": "1", "kcheck.kernel": "kv_cache_transfer",
		"kv_cache_dtype": "fp8_e4m3", "src_kv_cache_dtype": "bf16"}
	for _, tc := range []struct {
		code byte
		want compare.Verdict
	}{{0x38, check.Pass}, {0x39, check.Pass}, {0x3A, check.Fail}} {
		after := tensor.New(tensor.U8, 1, 1, 2)
		after.Data[0], after.Data[1] = tc.code, 0x44
		ts := map[string]*tensor.Tensor{
			"src_cache":        tensor.FromFloat64s(tensor.BF16, []int{1, 1, 2}, []float64{1.0625, 3}),
			"src_block_table":  tensor.FromInt64s(tensor.I32, []int{1, 1}, []int64{0}),
			"dst_cache_before": tensor.New(tensor.U8, 1, 1, 2),
			"dst_block_table":  tensor.FromInt64s(tensor.I32, []int{1, 1}, []int64{0}),
			"seq_lens":         tensor.FromInt64s(tensor.I32, []int{1}, []int64{1}),
			"dst_k_scale":      F32Scalar(1),
			"dst_cache_after":  after,
		}
		if r := check.Run(t.Context(), evidence.Capture{Name: "tie", Metadata: meta, Tensors: ts}, check.Options{}); r.Verdict != tc.want {
			t.Errorf("code %#02x for 1.0625: verdict %s, want %s (%v)", tc.code, r.Verdict, tc.want, reasons(r))
		}
	}
}

// A transfer as SGLang's disaggregation performs it, built from its source
// layout (sglang 0.5.23): the MLA pool's per-layer buffer is
// [size + page_size, 1, kv_lora_rank + qk_rope_head_dim] with page 0 the
// padding slot (sglang/srt/mem_cache/memory_pool.py:4863-4870); the
// transfer's unit is kv_item_len = kv_buffer[i][0].nbytes * page_size
// (memory_pool.py:4888-4890), and mooncake copies item_len bytes from
// src_ptr + prefill_index * item_len to dst_ptr + decode_index * item_len
// for each page pair (sglang/srt/disaggregation/mooncake/conn.py:1186-1191).
// The capture is the two buffers viewed as pages and the page index lists
// as block tables: it passes as whole_pages (what the transport does) and
// fails without it (the tail of a last page past seq_len moved too).
func TestSGLangWholePageTransfer(t *testing.T) {
	const page, size, dim = 16, 6 * 16, 576
	rng := NewRNG(161, 1)
	prefill := tensor.New(tensor.BF16, size+page, 1, dim) // kv_buffer[layer]
	decode := tensor.New(tensor.BF16, size+page, 1, dim)
	for i := 0; i < prefill.Len(); i++ {
		prefill.SetFloat64(i, rng.Normal())
		decode.SetFloat64(i, rng.Normal())
	}
	itemLen := dim * 2 * page // kv_buffer[i][0].nbytes * page_size
	seqLens := []int64{37, 5}
	prefillPages := [][]int64{{4, 1, 6}, {3}} // page indices, page 0 the padding
	decodePages := [][]int64{{2, 5, 3}, {6}}
	after := decode.Clone()
	for b := range seqLens {
		for j, pi := range prefillPages[b] {
			di := decodePages[b][j]
			copy(after.Data[int(di)*itemLen:int(di+1)*itemLen], prefill.Data[int(pi)*itemLen:int(pi+1)*itemLen])
		}
	}
	asPages := func(t *tensor.Tensor) *tensor.Tensor {
		return &tensor.Tensor{DType: t.DType, Shape: []int{t.Shape[0] / page, page, dim}, Data: t.Data}
	}
	table := func(pages [][]int64) *tensor.Tensor {
		return tensor.FromInt64s(tensor.I32, []int{2, 3}, append(append([]int64(nil), pages[0]...), pages[1][0], 0, 0))
	}
	for _, whole := range []string{"true", "false"} {
		meta := map[string]string{"kcheck.format": "1", "kcheck.kernel": "kv_cache_transfer", "kv_cache_dtype": "bf16",
			"page_size": "16", "whole_pages": whole, "source": "built from sglang 0.5.23's MLA pool and mooncake transfer"}
		ts := map[string]*tensor.Tensor{
			"src_cache": asPages(prefill), "src_block_table": table(prefillPages),
			"dst_cache_before": asPages(decode), "dst_block_table": table(decodePages),
			"seq_lens": tensor.FromInt64s(tensor.I32, []int{2}, seqLens), "dst_cache_after": asPages(after),
		}
		want := check.Pass
		if whole == "false" {
			want = check.Fail
		}
		if r := check.Run(t.Context(), evidence.Capture{Name: "sglang", Metadata: meta, Tensors: ts}, check.Options{}); r.Verdict != want {
			t.Errorf("whole_pages=%s: verdict %s, want %s (%v)", whole, r.Verdict, want, reasons(r))
		}
	}
}

// Caches of rank 0 are named, not indexed into.
func TestTransferScalarCaches(t *testing.T) {
	in, err := small("bf16", "bf16", 0, nil).Inputs()
	if err != nil {
		t.Fatal(err)
	}
	k, _ := Lookup("kv_cache_transfer")
	for _, name := range []string{"src_cache", "dst_cache_before"} {
		ts := maps.Clone(in.Tensors)
		ts[name] = tensor.New(tensor.BF16)
		_, err := Evaluate(context.Background(), k, Inputs{Tensors: ts, Params: in.Params}, DefaultPrecision(), nil)
		if want := "tensor " + name + " has shape []; the contract wants [NB, P, entry]"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want %q", err, want)
		}
	}
}

// One disaggregated decode step as a pipeline: the prefill node's cache
// sent to the decode node (stage cache, kv_cache_transfer), then decode
// attention over what arrived (stage attn, mla_decode, reading the decode
// side's block table). A correct transfer passes; a block-table shift in
// the transfer is named as the culprit stage cache, with attention correct
// on the cache it was given.
func TestDisaggregatedStepNamesTheTransfer(t *testing.T) {
	attnCase := cases.Case{Name: "pd", Kernel: "mla_decode", Preset: "deepseek-v3", Heads: 2, SeqLens: []int{20, 33},
		PageSize: 16, KVCacheDType: "bf16", Seed: 162}
	attn, err := attnCase.Inputs()
	if err != nil {
		t.Fatal(err)
	}
	src, srcTab := attn.Tensors["kv_cache"], attn.Tensors["block_table"]
	nb := src.Shape[0] + 3
	dst := tensor.New(tensor.BF16, nb, 16, 576)
	for i := range dst.Data {
		dst.Data[i] = 0xFF // the decode node's free pages, poisoned
	}
	dtab := srcTab.Clone() // the decode node's own block order
	for i := 0; i < dtab.Len(); i++ {
		dtab.SetInt64(i, int64(nb-1-i))
	}
	for _, fault := range []string{"", "transfer_block_table_shift"} {
		var be backend.Backend = backend.Reference{}
		if fault != "" {
			f, err := faults.Lookup(fault)
			if err != nil {
				t.Fatal(err)
			}
			be = faults.Backend{Fault: f}
		}
		meta := map[string]string{"kcheck.format": "1", "kcheck.kernel": "pipeline", "kcheck.stages": "cache,attn",
			"kcheck.cache.kernel": "kv_cache_transfer", "kcheck.attn.kernel": "mla_decode", "kcheck.attn.from.kv_cache": "cache.dst_cache_after",
			"cache.kv_cache_dtype": "bf16", "cache.page_size": "16"}
		xin := Inputs{Params: Params{"kv_cache_dtype": "bf16", "page_size": "16"}, Tensors: map[string]*tensor.Tensor{
			"src_cache": src, "src_block_table": srcTab, "dst_cache_before": dst, "dst_block_table": dtab, "seq_lens": attn.Tensors["seq_lens"]}}
		xout, err := be.Run(context.Background(), "kv_cache_transfer", xin)
		if err != nil {
			t.Fatal(err)
		}
		ts := map[string]*tensor.Tensor{}
		for k, v := range xin.Tensors {
			ts["cache."+k] = v
		}
		ts["cache.dst_cache_after"] = xout["dst_cache_after"]
		ain := Inputs{Params: Params{}, Tensors: maps.Clone(attn.Tensors)}
		maps.Copy(ain.Params, attn.Params)
		ain.Tensors["kv_cache"], ain.Tensors["block_table"] = xout["dst_cache_after"], dtab
		aout, err := backend.Reference{}.Run(context.Background(), "mla_decode", ain)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range ain.Tensors {
			if k != "kv_cache" {
				ts["attn."+k] = v
			}
		}
		for k, v := range aout {
			ts["attn."+k] = v
		}
		for k, v := range attn.Params {
			if !strings.HasPrefix(k, "kcheck.") {
				meta["attn."+k] = v
			}
		}
		r := check.Run(t.Context(), evidence.Capture{Name: "pd step", Metadata: meta, Tensors: ts}, check.Options{})
		stage := ""
		if r.Stage != nil {
			stage = *r.Stage
		}
		want, wantStage := check.Pass, ""
		if fault != "" {
			want, wantStage = check.Fail, "cache"
		}
		if r.Verdict != want || stage != wantStage {
			t.Errorf("fault %q: verdict %s, culprit %q; want %s, %q (%v)", fault, r.Verdict, stage, want, wantStage, reasons(r))
		}
	}
}

// The block lists slipping on the decode side (page j written into the
// decode block of page j+1; past the table, block 0) is named as the same
// bug. The capture is made here byte by byte, apart from the suspect.
func TestDecodeSideShiftIsNamed(t *testing.T) {
	c := small("bf16", "bf16", 0, nil)
	capt := captureOf(t, c, func(in Inputs, out map[string]*tensor.Tensor) {
		src, dst, st, dt := in.Tensors["src_cache"], in.Tensors["dst_cache_before"], in.Tensors["src_block_table"], in.Tensors["dst_block_table"]
		after := dst.Clone()
		e, p := dst.Shape[2]*2, dst.Shape[1]
		for b, n := range []int{37, 9} {
			for tk := 0; tk < n; tk++ {
				from := int(st.Int64At(b*st.Shape[1]+tk/p))*p + tk%p
				blk := int64(0)
				if j := tk/p + 1; j < dt.Shape[1] {
					blk = dt.Int64At(b*dt.Shape[1] + j)
				}
				to := int(blk)*p + tk%p
				copy(after.Data[to*e:(to+1)*e], src.Data[from*e:(from+1)*e])
			}
		}
		out["dst_cache_after"] = after
	})
	r := check.Run(t.Context(), capt, check.Options{})
	if r.Verdict != check.Fail || len(r.Checks) != 1 || r.Checks[0].Signature == nil || r.Checks[0].Signature.Pattern != signature.BlockTableShift {
		t.Fatalf("a decode-side shift: %v", reasons(r))
	}
	t.Log(r.Checks[0].Signature.Detail)
}
