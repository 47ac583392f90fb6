package progress

import (
	"bytes"
	"os"
	"testing"
)

// No bar is drawn into anything that is not a terminal, nor with quiet.
func TestNoBarWithoutTerminal(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var buf bytes.Buffer
	for _, tc := range []struct {
		name  string
		bar   *Bar
		quiet bool
	}{
		{"buffer", New(10, &buf, false), false},
		{"regular file", New(10, f, false), false},
		{"quiet", New(10, &buf, true), true},
	} {
		if tc.bar.Active() {
			t.Errorf("%s: bar active", tc.name)
		}
		tc.bar.Describe("case")
		tc.bar.Add(3)
		tc.bar.Finish()
	}
	if buf.Len() != 0 {
		t.Errorf("bar wrote %q into a buffer", buf.String())
	}
	if st, _ := f.Stat(); st.Size() != 0 {
		t.Errorf("bar wrote %d bytes into a regular file", st.Size())
	}
	if IsTerminal(&buf) || IsTerminal(f) {
		t.Error("a buffer or a regular file taken for a terminal")
	}
	var nilBar *Bar
	nilBar.Add(1) // a nil bar is a no-op, not a panic
}
