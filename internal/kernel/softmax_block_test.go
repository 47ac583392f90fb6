package kernel

import (
	"strings"
	"testing"
)

// TestPrecisionSoftmaxBlock: softmax_block is read as a token count within
// bounds, absent means 0 (FlashMLA's 64 in the reference), and a bad value
// is an error naming the parameter.
func TestPrecisionSoftmaxBlock(t *testing.T) {
	cases := []struct {
		value string
		want  int
		err   string
	}{
		{"", 0, ""},
		{"32", 32, ""},
		{"64", 64, ""},
		{"4096", 4096, ""},
		{"0", 0, "softmax_block"},
		{"-32", 0, "softmax_block"},
		{"4097", 0, "softmax_block"},
		{"32.5", 0, "softmax_block"},
		{"many", 0, "softmax_block"},
	}
	for _, c := range cases {
		p := Params{}
		if c.value != "" {
			p["softmax_block"] = c.value
		}
		pr, err := PrecisionFrom(p)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("softmax_block=%q: err %v, want one naming %s", c.value, err, c.err)
			}
			continue
		}
		if err != nil || pr.SoftmaxBlock != c.want {
			t.Errorf("softmax_block=%q: %d, %v; want %d", c.value, pr.SoftmaxBlock, err, c.want)
		}
	}
}
