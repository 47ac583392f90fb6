package engines

import (
	"bytes"
	"flag"
	"os"
	"testing"
)

var update = flag.Bool("update", false, "rewrite python/kcheck/engines.json from the Go table")

// The Python workers read the engine table from python/kcheck/engines.json;
// this keeps that file identical to the table --from ENGINE uses (go test
// ./internal/engines -run TestExportedTable -update regenerates it).
func TestExportedTable(t *testing.T) {
	const path = "../../python/kcheck/engines.json"
	want, err := ExportJSON()
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (regenerate with -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the Go engine table: regenerate it with go test ./internal/engines -run TestExportedTable -update", path)
	}
}
