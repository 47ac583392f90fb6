package kvcache

import (
	"encoding/binary"
	"math"
)

// widenBF16Generic sets dst[j] to the bf16 value stored little-endian at
// src[2j:2j+2] (exactly: a bf16 is the top half of a float32).
func widenBF16Generic(dst []float64, src []byte) {
	src = src[:2*len(dst)]
	for j := range dst {
		dst[j] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*j:])) << 16))
	}
}
