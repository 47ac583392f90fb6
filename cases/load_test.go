package cases_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/kcheck-dev/kcheck/cases"
	"github.com/kcheck-dev/kcheck/internal/bounded"
)

// A case file is read whole, within MaxFileSize (issue 11 item 10): a
// file one byte over (sparse: it costs no disk) is refused by name, before
// it is parsed.
func TestLoadBounded(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, MaxFileSize+1); err != nil {
		t.Fatal(err)
	}
	_, err := Load(big)
	if !errors.Is(err, bounded.ErrTooLarge) || !strings.Contains(err.Error(), big+": a file of more than 32.0 MiB, the limit of case files: refused") {
		t.Fatalf("err = %v, want the 32 MiB refusal", err)
	}
	ok := filepath.Join(dir, "ok.json")
	if err := os.WriteFile(ok, []byte(`{"cases":[{"name":"a","kernel":"nvfp4_quantize","m":2,"k":32}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if cs, err := Load(ok); err != nil || len(cs) != 1 {
		t.Fatalf("Load(ok) = %v, %v", cs, err)
	}
}
