// Package simd says which vector instruction sets the reference packages'
// assembly kernels may use on this CPU: one place that decides, so that
// every package takes the same level, and a list of every level the CPU
// runs, so that tests hold each level's kernels to the plain-Go
// definitions (a machine with AVX-512 also tests the AVX2 kernels that a
// machine without it runs).
package simd

import "golang.org/x/sys/cpu"

// Level is a set of vector instructions, each a superset of the one
// before it.
type Level int

const (
	// Generic is no assembly: the plain-Go definitions.
	Generic Level = iota
	// AVX2 is AVX2 with FMA3 and POPCNT (Haswell, AMD Zen and later,
	// what GOAMD64=v3 assumes of these): 256-bit vectors, sixteen
	// registers.
	AVX2
	// AVX512 is AVX-512 F and VL (Skylake-SP, Zen 4 and later): 512-bit
	// vectors, thirty-two registers.
	AVX512
)

func (l Level) String() string {
	switch l {
	case AVX2:
		return "avx2"
	case AVX512:
		return "avx512"
	}
	return "generic"
}

// Supported lists the levels this CPU runs, Generic first and the widest
// last (only Generic off amd64).
func Supported() []Level {
	levels := []Level{Generic}
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasPOPCNT {
		levels = append(levels, AVX2)
		if cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL {
			levels = append(levels, AVX512)
		}
	}
	return levels
}

// Best is the widest level this CPU runs.
func Best() Level {
	s := Supported()
	return s[len(s)-1]
}

// AtEachLevel runs f as a subtest (or sub-benchmark) of tb, named after
// the level, once for each of levels, with *level set to it; *level is
// restored when it returns. The packages' twin tests and benchmarks pass
// their own level and levels, so that a machine with AVX-512 runs the AVX2
// kernels and the plain Go too, side by side.
func AtEachLevel[T interface{ Run(string, func(T)) bool }](tb T, level *Level, levels []Level, f func(T)) {
	defer func(l Level) { *level = l }(*level)
	for _, l := range levels {
		*level = l
		tb.Run(l.String(), f)
	}
}
