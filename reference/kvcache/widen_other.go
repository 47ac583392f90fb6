//go:build !amd64 || purego

package kvcache

import "github.com/kcheck-dev/kcheck/reference/internal/simd"

var level, levels = simd.Generic, []simd.Level{simd.Generic}

func widenBF16(dst []float64, src []byte) { widenBF16Generic(dst, src) }
