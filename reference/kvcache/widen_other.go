//go:build !amd64 || purego

package kvcache

func widenBF16(dst []float64, src []byte) { widenBF16Generic(dst, src) }
