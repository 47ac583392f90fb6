//go:build cuda

package cuda_test

import (
	"encoding/binary"
	"fmt"
	"math/rand"
	"strconv"
	"testing"

	"github.com/kcheck-dev/kcheck/cuda"
	"github.com/kcheck-dev/kcheck/internal/kernel"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Benchmarks (issue: performance, measured where a GPU is lent). Run them
// with -test.bench . -test.benchtime 1x: each one times its kernel with CUDA
// events over several repetitions and reports the figure against a
// device-to-device copy measured in the same run, never as a pass/fail.

// randBF16 fills n bf16 values uniform-ish in (-1, 1) (sign, exponent
// 2^-8..2^-1, random mantissa), fast enough for gigabyte caches.
func randBF16(n int, seed uint64) []byte {
	b := make([]byte, 2*n)
	x := seed | 1
	for i := 0; i < n; i += 4 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		for j := 0; j < 4 && i+j < n; j++ {
			r := uint16(x >> (16 * j))
			exp := uint16(119 + (r>>7)%7) // 2^-8 .. 2^-2
			v := (r & 0x8000) | exp<<7 | (r & 0x7f)
			binary.LittleEndian.PutUint16(b[2*(i+j):], v)
		}
	}
	return b
}

func ms(res *cuda.Result) float64 {
	v, _ := strconv.ParseFloat(res.Meta["kcheck.cuda.ms"], 64)
	return v
}

// BenchmarkMLADecode: B = 64, s_q = 1, context 8192, bf16 cache in 64-token
// pages scattered over the cache, DeepSeek-V3 TP8 heads (16) and full heads
// (128). Figure: unique KV bytes read per second, against the read rate of
// a device-to-device copy of the same bytes (target >= 70%).
func BenchmarkMLADecode(b *testing.B) {
	const B, ctx, P, D = 64, 8192, 64, 576
	nb := B * ctx / P
	cache := &tensor.Tensor{DType: tensor.BF16, Shape: []int{nb, P, D}, Data: randBF16(nb*P*D, 7)}
	perm := rand.New(rand.NewSource(1)).Perm(nb)
	bt := make([]int64, B*(ctx/P))
	for i := range bt {
		bt[i] = int64(perm[i])
	}
	sl := make([]int64, B)
	for i := range sl {
		sl[i] = ctx
	}
	kvBytes := int64(B) * ctx * D * 2
	copyMS, err := dev.CopyMillis(kvBytes, 10)
	if err != nil {
		b.Fatal(err)
	}
	copyReadGBs := float64(kvBytes) / copyMS / 1e6 // a copy reads kvBytes (and writes as many)
	for _, h := range []int{16, 128} {
		b.Run(fmt.Sprintf("H%d", h), func(b *testing.B) {
			in := kernel.Inputs{
				Tensors: map[string]*tensor.Tensor{
					"q":           {DType: tensor.BF16, Shape: []int{B, 1, h, D}, Data: randBF16(B*h*D, 3)},
					"kv_cache":    cache,
					"block_table": tensor.FromInt64s(tensor.I32, []int{B, ctx / P}, bt),
					"seq_lens":    tensor.FromInt64s(tensor.I32, []int{B}, sl),
				},
				Params: kernel.Params{"softmax_scale": "0.1352337788608801", "kv_cache_dtype": "bf16", "page_size": "64"},
			}
			var res *cuda.Result
			for i := 0; i < b.N; i++ {
				if res, err = dev.Run("mla_decode", in, cuda.RunOptions{Repeat: 20}); err != nil {
					b.Fatal(err)
				}
			}
			t := ms(res)
			gbs := float64(kvBytes) / t / 1e6
			b.ReportMetric(t, "kernel_ms")
			b.ReportMetric(gbs, "kv_GB/s")
			b.ReportMetric(gbs/copyReadGBs, "of_copy")
			addBench(benchRow{Name: fmt.Sprintf("mla_decode B=64 s_q=1 H=%d ctx=8192 bf16 (splits %s)", h, res.Meta["kcheck.cuda.splits"]), MS: t,
				Figure: fmt.Sprintf("%.0f GB/s KV read", gbs), Yardstick: fmt.Sprintf("copy reads %.0f GB/s", copyReadGBs),
				Ratio: fmt.Sprintf("%.0f%%", 100*gbs/copyReadGBs), Target: ">= 70%"})
		})
	}
}

// BenchmarkNVFP4Dequantize: M = 16384, K = 7168 to bf16. Figure: bytes read
// and written per second against a copy's (target >= 80%).
func BenchmarkNVFP4Dequantize(b *testing.B) {
	const M, K = 16384, 7168
	packed := &tensor.Tensor{DType: tensor.U8, Shape: []int{M, K / 2}, Data: randBF16(M*K/4, 11)}
	sf := tensor.New(tensor.F8E4M3, M, K/16)
	for i := range sf.Data {
		sf.Data[i] = byte(0x30 + i%16) // E4M3 0.5 .. 1.875
	}
	in := kernel.Inputs{
		Tensors: map[string]*tensor.Tensor{"packed": packed, "block_scale": sf, "global_scale": tensor.FromFloat64s(tensor.F32, []int{}, []float64{1})},
		Params:  kernel.Params{"scale_layout": "linear"},
	}
	moved := int64(len(packed.Data) + len(sf.Data) + M*K*2)
	copyMS, err := dev.CopyMillis(moved/2, 10)
	if err != nil {
		b.Fatal(err)
	}
	copyGBs := float64(moved) / copyMS / 1e6 // read + write of moved/2 bytes each
	var res *cuda.Result
	for i := 0; i < b.N; i++ {
		if res, err = dev.Run("nvfp4_dequantize", in, cuda.RunOptions{Repeat: 20}); err != nil {
			b.Fatal(err)
		}
	}
	t := ms(res)
	gbs := float64(moved) / t / 1e6
	b.ReportMetric(t, "kernel_ms")
	b.ReportMetric(gbs, "GB/s")
	b.ReportMetric(gbs/copyGBs, "of_copy")
	addBench(benchRow{Name: "nvfp4_dequantize 16384x7168 -> bf16", MS: t, Figure: fmt.Sprintf("%.0f GB/s moved", gbs),
		Yardstick: fmt.Sprintf("copy moves %.0f GB/s", copyGBs), Ratio: fmt.Sprintf("%.0f%%", 100*gbs/copyGBs), Target: ">= 80%"})
}

// BenchmarkNVFP4GEMM: W4A4 at DeepSeek-V3 projection shapes, prefill (M =
// 4096) and decode (M = 64) sizes. Figure: TFLOP/s (2MNK / t). No cuBLAS
// yardstick: the worker has no cuBLAS binding.
func BenchmarkNVFP4GEMM(b *testing.B) {
	shapes := []struct {
		name string
		n, k int
	}{
		{"q_a_proj", 1536, 7168},
		{"kv_a_proj", 576, 7168},
		{"o_proj", 7168, 16384},
		{"moe_w13", 4096, 7168},
		{"moe_w2", 7168, 2048},
	}
	for _, m := range []int{4096, 64} {
		for _, s := range shapes {
			b.Run(fmt.Sprintf("%s/M%d", s.name, m), func(b *testing.B) {
				mk := func(rows int, seed uint64) (*tensor.Tensor, *tensor.Tensor) {
					p := &tensor.Tensor{DType: tensor.U8, Shape: []int{rows, s.k / 2}, Data: randBF16(rows*s.k/4, seed)}
					sc := tensor.New(tensor.F8E4M3, rows, s.k/16)
					for i := range sc.Data {
						sc.Data[i] = byte(0x30 + i%16)
					}
					return p, sc
				}
				ap, as := mk(m, 5)
				bp, bs := mk(s.n, 9)
				one := tensor.FromFloat64s(tensor.F32, []int{}, []float64{1})
				in := kernel.Inputs{
					Tensors: map[string]*tensor.Tensor{"a_packed": ap, "a_scale": as, "a_global": one, "b_packed": bp, "b_scale": bs, "b_global": one},
					Params:  kernel.Params{"scale_layout": "linear"},
				}
				var res *cuda.Result
				var err error
				for i := 0; i < b.N; i++ {
					if res, err = dev.Run("nvfp4_gemm", in, cuda.RunOptions{Repeat: 10}); err != nil {
						b.Fatal(err)
					}
				}
				t := ms(res)
				tflops := 2 * float64(m) * float64(s.n) * float64(s.k) / t / 1e9
				b.ReportMetric(t, "kernel_ms")
				b.ReportMetric(tflops, "TFLOP/s")
				addBench(benchRow{Name: fmt.Sprintf("nvfp4_gemm %s M=%d N=%d K=%d (%s)", s.name, m, s.n, s.k, res.Meta["kcheck.cuda.gemm_path"]), MS: t,
					Figure: fmt.Sprintf("%.1f TFLOP/s", tflops), Yardstick: "cuBLAS bf16: not measured (no binding)", Ratio: "-", Target: "-"})
			})
		}
	}
}
