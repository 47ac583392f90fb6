package kvcache

import (
	"encoding/binary"
	"math"

	"github.com/kcheck-dev/kcheck/reference/formats"
)

// widenBF16Generic sets dst[j] to the bf16 value stored little-endian at
// src[2j:2j+2] (exactly: a bf16 is the top half of a float32).
func widenBF16Generic(dst []float64, src []byte) {
	src = src[:2*len(dst)]
	for j := range dst {
		dst[j] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*j:])) << 16))
	}
}

// widenFP16 sets dst[j] to the fp16 value stored little-endian at
// src[2j:2j+2] (exactly: every fp16 is a float32). An fp16 cache is rarer
// than a bf16 one and has no vector path.
func widenFP16(dst []float64, src []byte) {
	src = src[:2*len(dst)]
	for j := range dst {
		dst[j] = float64(formats.FP16Decode(binary.LittleEndian.Uint16(src[2*j:])))
	}
}
