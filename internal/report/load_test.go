package report

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Crafted report.json files (testdata/crafted, also the seeds of FuzzLoad)
// that made `kcheck report` panic or loop: Load refuses each with a message
// naming what is wrong, or the report renders whole.
func TestLoadCrafted(t *testing.T) {
	cases := []struct {
		file string
		want string // "" renders
	}{
		{"profile_short_counts.json", `coordinate "token": 4 values but 2 maxima, 1 means, 0 failing counts and 0 element counts`},
		{"heat_map_short_rows.json", "heat map: row 0 has 1 cells for 3 latent values"},
		{"tokens_near_2_60.json", "value 1152921504606846976 is beyond ±2^40"},
		{"profile_axes_past_coords.json", "axes = 3, but 1 coordinates"},
		{"profile_values_descending.json", "values not ascending: 2 after 3"},
		{"drift_steps_near_2_62.json", "diagnosis: step 1: value 4611686018427387904 is beyond ±2^40"},
		{"nan_mismatch_everywhere.json", ""},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			path := filepath.Join("testdata", "crafted", tc.file)
			b, err := Load(path)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
					t.Fatalf("Load: %v\nwant an error naming %s and saying %q", err, path, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := WriteDir(t.TempDir(), b, WriteOptions{})
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(time.Minute):
				t.Fatal("rendering did not finish in a minute")
			}
		})
	}
	// Every crafted file is in the table.
	all, _ := filepath.Glob(filepath.Join("testdata", "crafted", "*.json"))
	if len(all) != len(cases) {
		t.Errorf("%d crafted files, %d in the table", len(all), len(cases))
	}
}
