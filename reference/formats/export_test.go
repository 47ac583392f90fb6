package formats

// EncodeGeneral is the arithmetic encoder, for the tests of the bit-level
// one against it.
func (f *Minifloat) EncodeGeneral(x float64, ov Overflow) (uint8, Accuracy) {
	return f.encodeGeneral(x, ov)
}

// NearTieGeneral is NearTie's arithmetic definition, for the tests of the
// bit-level one against it.
func (f *Minifloat) NearTieGeneral(x, relTol float64) bool {
	return f.nearTieGeneral(x, relTol)
}
