//go:build !amd64 || purego || amd64.v3

package normal

import "github.com/kcheck-dev/kcheck/reference/internal/simd"

// Elsewhere (and where the compiler fuses multiply-adds, as it does for
// GOAMD64=v3 and up, so that math.Sincos rounds otherwise than the
// assembly) the definition runs alone.

var level, levels = simd.Generic, []simd.Level{simd.Generic}

func useAsm() bool { return false }

func boxMullerAVX2(u1, u2, c, s *float64, n int) { panic("normal: no assembly in this build") }
