package nvfp4

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/reference/formats"
	"github.com/kcheck-dev/kcheck/reference/internal/simd"
	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// randomMatrix draws random codes and scales. scaleCodes, when set, limits
// the block scales to those codes.
func randomMatrix(r *rand.Rand, rows, k int, global float64, kind GlobalKind, scaleCodes []uint8) *Matrix {
	codes := make([]uint8, rows*k)
	for i := range codes {
		codes[i] = uint8(r.IntN(16))
	}
	scales := make([]uint8, rows*k/BlockSize)
	for i := range scales {
		if scaleCodes != nil {
			scales[i] = scaleCodes[r.IntN(len(scaleCodes))]
		} else {
			scales[i] = uint8(1 + r.IntN(0x7E)) // any finite positive E4M3
		}
	}
	return &Matrix{Rows: rows, K: k, Packed: Pack(codes), Scales: scales, Global: global, Kind: kind}
}

// The GEMM against a plain triple loop over independently dequantized
// elements (decode each nibble, scale and global with formats directly).
func TestGEMMAgainstNaiveLoop(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, sh := range [][3]int{{1, 1, 16}, {3, 5, 32}, {7, 4, 160}, {17, 9, 256}} {
		m, n, k := sh[0], sh[1], sh[2]
		a := randomMatrix(r, m, k, float64(float32(0.0123)), Dequant, nil)
		b := randomMatrix(r, n, k, float64(float32(2688/3.7)), Quant, nil)
		exact, _, err := GEMM(context.Background(), a, b, tensor.BF16)
		if err != nil {
			t.Fatal(err)
		}
		deq := func(x *Matrix, row, col int) float64 {
			i := row*x.K + col
			nib := x.Packed[i/2] >> (4 * uint(i%2)) & 0xF
			v := formats.E2M1.Decode(nib) * formats.E4M3FN.Decode(x.Scales[row*(x.K/16)+col/16])
			if x.Kind == Quant {
				return v / x.Global
			}
			return v * x.Global
		}
		nonzero := 0
		for i := 0; i < m; i++ {
			for j := 0; j < n; j++ {
				want, mag := 0.0, 0.0
				for c := 0; c < k; c++ {
					p := deq(a, i, c) * deq(b, j, c)
					want += p
					mag += math.Abs(p)
				}
				got := exact[i*n+j]
				if math.Abs(got-want) > 4*float64(k)*0x1p-53*mag {
					t.Errorf("[%d,%d,%d] out[%d,%d] = %.17g, naive %.17g", m, n, k, i, j, got, want)
				}
				if got != 0 {
					nonzero++
				}
			}
		}
		if nonzero == 0 {
			t.Errorf("[%d,%d,%d]: output all zeros", m, n, k)
		}
	}
}

// With power-of-two scales and globals every product and sum is an
// integer multiple of a power of two, so an int64 computation is exact and
// the float64 GEMM must match it bit for bit; the fp32 accumulation is exact
// too, so Expected is exactly the BF16 rounding of it.
func TestGEMMBitExactOnIntegers(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	// E4M3 codes of 0.5, 1, 2, 4: exponent fields 6..9, mantissa 0.
	pow2 := []uint8{0x30, 0x38, 0x40, 0x48}
	m, n, k := 6, 5, 128
	a := randomMatrix(r, m, k, 0.25, Dequant, pow2)
	b := randomMatrix(r, n, k, 2, Quant, pow2)
	exact, expected, err := GEMM(context.Background(), a, b, tensor.BF16)
	if err != nil {
		t.Fatal(err)
	}
	// In units of 2^-2 (code values doubled: e2m1*2 is an integer) and 2^-1
	// (smallest scale) for each operand: value = int * 2^-2 * 2^-1 ... so
	// out = Σ (2*ca)(2*cb) * 2^(ea+eb) / 4 * 0.25 / 2, with ea, eb >= -1.
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var units int64 // in 2^-2 (from ea+eb >= -2)
			for c := 0; c < k; c++ {
				ca := int64(2 * formats.E2M1.Decode(a.Code(i, c)))
				cb := int64(2 * formats.E2M1.Decode(b.Code(j, c)))
				ea := int(a.Scales[i*(k/16)+c/16]>>3) - 7
				eb := int(b.Scales[j*(k/16)+c/16]>>3) - 7
				units += ca * cb << uint(ea+eb+2)
			}
			want := math.Ldexp(float64(units), -2-2-2-1) // 2^-2 units, /4 for the doubled codes, *0.25, /2
			if exact[i*n+j] != want {
				t.Errorf("out[%d,%d] = %v, integer arithmetic %v", i, j, exact[i*n+j], want)
			}
			if bf := formats.RoundBF16(want); expected[i*n+j] != bf {
				t.Errorf("expected[%d,%d] = %v, want bf16(%v) = %v", i, j, expected[i*n+j], want, bf)
			}
		}
	}
}

// Expected differs from exact by no more than fp32 accumulation over K/16
// block partials (gamma_{K/16} in fp32 of Σ|partials|) plus the fp32
// epilogue and the final bf16 rounding.
func TestGEMMExpectedWithinAccumulationBound(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	m, n, k := 8, 8, 2048
	a := randomMatrix(r, m, k, float64(float32(1.0/2688)), Dequant, nil)
	b := randomMatrix(r, n, k, float64(float32(1.0/1000)), Dequant, nil)
	exact, expected, err := GEMM(context.Background(), a, b, tensor.BF16)
	if err != nil {
		t.Fatal(err)
	}
	av, bv := a.blockValues(), b.blockValues()
	differ := 0
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			mag := 0.0
			for c := 0; c < k; c++ {
				mag += math.Abs(float64(av[i*k+c]) * float64(bv[j*k+c]))
			}
			mag *= a.Global * b.Global
			nb := float64(k / 16)
			bound := (nb+2)*0x1p-24*mag + 0x1p-8*math.Abs(exact[i*n+j])
			if d := math.Abs(expected[i*n+j] - exact[i*n+j]); d > bound {
				t.Errorf("out[%d,%d]: |expected-exact| = %g > bound %g", i, j, d, bound)
			}
			if expected[i*n+j] != exact[i*n+j] {
				differ++
			}
		}
	}
	if differ == 0 {
		t.Error("expected equals exact everywhere: the bf16 rounding went missing")
	}
}

func TestGEMMRejects(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	a := randomMatrix(r, 2, 32, 1, Dequant, nil)
	b := randomMatrix(r, 2, 48, 1, Dequant, nil)
	if _, _, err := GEMM(context.Background(), a, b, tensor.BF16); err == nil || err.Error() != "a has K = 32 but b has K = 48" {
		t.Errorf("K mismatch: %v", err)
	}
	if _, _, err := GEMM(context.Background(), a, a, tensor.U8); err == nil {
		t.Error("U8 output accepted")
	}
	bad := *a
	bad.Scales = bad.Scales[:1]
	if _, _, err := GEMM(context.Background(), &bad, a, tensor.BF16); err == nil {
		t.Error("short scales accepted")
	}
}

func TestGEMMPropagatesNaN(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 2))
	a := randomMatrix(r, 2, 32, 1, Dequant, nil)
	b := randomMatrix(r, 3, 32, 1, Dequant, nil)
	a.Scales[1*2+1] = 0x7F // row 1, second block: NaN scale
	exact, expected, err := GEMM(context.Background(), a, b, tensor.BF16)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		for j := 0; j < 3; j++ {
			if nan := math.IsNaN(exact[i*3+j]); nan != (i == 1) || math.IsNaN(expected[i*3+j]) != nan {
				t.Errorf("out[%d,%d]: exact %v expected %v; NaN only in row 1", i, j, exact[i*3+j], expected[i*3+j])
			}
		}
	}
}

// BenchmarkGEMMDeepSeek is the largest real shape (M = 256 tokens, N = 2048,
// K = 7168), at every level of the kernels this CPU runs; it must run in
// seconds.
func BenchmarkGEMMDeepSeek(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 3))
	x := randomMatrix(r, 256, 7168, 1e-3, Dequant, nil)
	w := randomMatrix(r, 2048, 7168, 1e-3, Dequant, nil)
	simd.AtEachLevel(b, &level, levels, func(b *testing.B) {
		for b.Loop() {
			if _, _, err := GEMM(context.Background(), x, w, tensor.BF16); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(2*256*2048*7168*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	})
}

// The references stop soon after their context is done: a GEMM of about
// 8.6e9 multiply-adds between output tiles (K is short so that the
// operands' block values, made before the tiles start, take little), the
// (de)quantizers between runs of blocks (here canceled before they start).
func TestReferencesStop(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	a := randomMatrix(r, 4096, 512, 1, Dequant, nil)
	b := randomMatrix(r, 4096, 512, 1, Dequant, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err := GEMM(ctx, a, b, tensor.BF16)
	if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || took > 2*time.Second {
		t.Errorf("GEMM: err = %v after %v, want the deadline soon after 20ms", err, took)
	}
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	x := make([]float64, 64*1024)
	for name, run := range map[string]func() error{
		"Quantize":           func() error { _, err := Quantize(canceled, x, 64, 1024, 1); return err },
		"QuantizeExpected":   func() error { _, err := QuantizeExpected(canceled, x, 64, 1024, 1); return err },
		"Dequantize":         func() error { _, err := Dequantize(canceled, a); return err },
		"DequantizeExpected": func() error { _, err := DequantizeExpected(canceled, a, tensor.F32); return err },
	} {
		if err := run(); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: err = %v, want context.Canceled", name, err)
		}
	}
}
