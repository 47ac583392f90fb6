package check

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/reference/tensor"
)

// Notes are bounded (issue 11 item 12: a 99 MB header of 1.7 million
// tensors gave 103 MB of notes): a capture with many tensors outside the
// contract names the first few and counts the rest in one note.
func TestIgnoredTensorNotesBounded(t *testing.T) {
	for _, extra := range []int{1, maxNamedNotes, maxNamedNotes + 1, 100000} {
		t.Run(fmt.Sprint(extra), func(t *testing.T) {
			c := load(t, "nvfp4_dequantize.safetensors")
			for i := 0; i < extra; i++ {
				c.Tensors[fmt.Sprintf("extra%06d", i)] = tensor.New(tensor.U8, 0)
			}
			res := Run(t.Context(), c, Options{})
			if res.Verdict != Pass {
				t.Fatalf("verdict %s: %v", res.Verdict, deref(res.Error))
			}
			named, summary := 0, ""
			for _, n := range res.Notes {
				switch {
				case strings.HasPrefix(n, "tensor extra"):
					named++
				case strings.Contains(n, "more tensors"):
					summary = n
				}
			}
			wantNamed := min(extra, maxNamedNotes)
			if named != wantNamed {
				t.Errorf("%d tensors named in notes, want %d", named, wantNamed)
			}
			if extra > maxNamedNotes {
				want := fmt.Sprintf("and %d more tensors are not part of the nvfp4_dequantize contract: ignored", extra-maxNamedNotes)
				if summary != want {
					t.Errorf("summary note %q, want %q", summary, want)
				}
			} else if summary != "" {
				t.Errorf("summary note %q for %d extra tensors", summary, extra)
			}
			if size := len(strings.Join(res.Notes, "")); size > 8<<10 {
				t.Errorf("notes take %d bytes", size)
			}
		})
	}
}

func TestBoundNotes(t *testing.T) {
	for _, n := range []int{0, 1, maxNotes, maxNotes + 1, 5000} {
		notes := make([]string, n)
		for i := range notes {
			notes[i] = fmt.Sprint("note ", i)
		}
		got := boundNotes(notes)
		if n <= maxNotes {
			if len(got) != n {
				t.Errorf("%d notes became %d", n, len(got))
			}
			continue
		}
		if len(got) != maxNotes || got[maxNotes-2] != fmt.Sprint("note ", maxNotes-2) || got[maxNotes-1] != fmt.Sprintf("and %d more notes", n-maxNotes+1) {
			t.Errorf("%d notes became %d, ending %q", n, len(got), got[len(got)-1])
		}
	}
}
