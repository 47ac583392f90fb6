package engines

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/check"
	"github.com/kcheck-dev/kcheck/internal/compare"
)

// corpusDir holds the committed part of the issue-16 engine-capture corpus
// (python/kcheck/corpus, `make corpus-committed`): captures the engines'
// own code produced, in their own names, dtypes and layouts, each with a
// planted-fault twin, and manifest.json with the verdict kcheck must give.
const corpusDir = "../../fixtures/engines/corpus"

type corpusEntry struct {
	File   string `json:"file"`
	From   string `json:"from"`
	Kernel string `json:"kernel"`
	Expect struct {
		Verdict string `json:"verdict"`
		Tensor  string `json:"tensor"`
		Message string `json:"message"`
	} `json:"expect"`
	PlantedFault *string `json:"planted_fault"`
}

// Every committed corpus capture gets the manifest's verdict under --from
// its engine: a faithful capture passes, its twin fails on the tensor the
// manifest names (in the engine's name, read through the engine's table),
// a refusal names what it refuses. This is what `make test` checks of the
// corpus without Python.
func TestCorpusVerdicts(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(corpusDir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Files []corpusEntry `json:"files"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Files) == 0 {
		t.Fatal("the manifest lists no capture")
	}
	passes, fails := 0, 0
	for _, e := range m.Files {
		t.Run(e.File, func(t *testing.T) {
			c, closeFile, err := check.Load(filepath.Join(corpusDir, e.File), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer closeFile()
			c.Name = e.File
			r := check.Run(t.Context(), c, fromOpts(t, e.From))
			notes := strings.Join(r.Notes, "\n  ")
			switch e.Expect.Verdict {
			case "pass":
				passes++
				if r.Verdict != check.Pass {
					t.Fatalf("verdict %s, the manifest says pass\n  %s\n  %s", r.Verdict, failing(r), notes)
				}
			case "fail":
				fails++
				if e.PlantedFault == nil {
					t.Fatalf("the manifest expects a failure of a capture with no planted fault")
				}
				if r.Verdict != check.Fail {
					t.Fatalf("verdict %s for planted fault %s, the manifest says fail\n  %s", r.Verdict, *e.PlantedFault, notes)
				}
				want := e.Expect.Tensor
				if to, ok := registry[e.From].Kernels[e.Kernel].Tensors[want]; ok {
					want = to
				}
				if got := failing(r); !strings.Contains(" "+got+" ", " "+want+" ") {
					t.Fatalf("failing outputs %q; the manifest names %s (%s)", got, e.Expect.Tensor, want)
				}
			case "error":
				if r.Verdict != check.Error || r.Error == nil || !strings.Contains(*r.Error, e.Expect.Message) {
					t.Fatalf("verdict %s, error %v; the manifest wants an error naming %q", r.Verdict, r.Error, e.Expect.Message)
				}
			default:
				t.Fatalf("the manifest's verdict %q is none of pass, fail, error", e.Expect.Verdict)
			}
		})
	}
	if passes == 0 || fails == 0 {
		t.Errorf("%d passing and %d failing captures: the corpus needs both", passes, fails)
	}
}

// failing lists the outputs whose check did not pass.
func failing(r check.Result) string {
	var names []string
	for _, c := range r.Checks {
		if c.Verdict != compare.Pass {
			names = append(names, c.Tensor)
		}
	}
	return strings.Join(names, " ")
}
