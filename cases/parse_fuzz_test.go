package cases_test

import (
	"sort"
	"strings"
	"testing"

	. "github.com/kcheck-dev/kcheck/cases"
)

// FuzzParse feeds the case-file parser arbitrary bytes (a user's --cases
// file). It must never panic or run away: a family's matrix multiplies out,
// so a small file can ask for billions of cases, which Parse must refuse
// rather than expand. What it accepts must be a usable selection: names
// unique, non-empty and sorted, every case valid, its metadata buildable.
// CI runs it for a short fixed time (make fuzz-short):
//
//	go test -run='^$' -fuzz='^FuzzParse$' -fuzztime=10m -parallel 1 ./cases
func FuzzParse(f *testing.F) {
	f.Add(CatalogJSON)
	for _, s := range []string{
		`{"cases":[{"name":"a","kernel":"kv_cache_write"}]}`,
		`{"cases":[{"name":"a","kernel":"mla_decode","splits":1000000,"seq_lens":[2147483647]}]}`,
		`{"families":[{"name":"f/{x}/{context}","base":{"kernel":"mla_decode"},"matrix":{"x":[1,2],"context":["P-1","2P+S","-3"]}}]}`,
		`{"families":[{"name":"f/{m}","base":{"kernel":"nvfp4_gemm"},"matrix":{"m":[{"label":"big","m":4,"k":32}]},"skip":[{"m":"big"}]}]}`,
		`{"families":[{"name":"x","base":{"kernel":"dsa_indexer"},"matrix":{"a":[1,2,3,4,5,6,7,8,9,10],"b":[1,2,3,4,5,6,7,8,9,10],"c":[1,2,3,4,5,6,7,8,9,10],"d":[1,2,3,4,5,6,7,8,9,10],"e":[1,2,3,4,5,6,7,8,9,10],"f":[1,2,3,4,5,6,7,8,9,10],"g":[1,2,3,4,5,6,7,8,9,10]}}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cs, err := Parse(b, "fuzz.json")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.json") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		if len(cs) > MaxCases {
			t.Fatalf("accepted %d cases, more than MaxCases = %d", len(cs), MaxCases)
		}
		if !sort.SliceIsSorted(cs, func(i, j int) bool { return cs[i].Name < cs[j].Name }) {
			t.Fatal("cases are not sorted by name")
		}
		for i, c := range cs {
			if c.Name == "" || c.Kernel == "" {
				t.Fatalf("case %d has no name or kernel", i)
			}
			if i > 0 && cs[i-1].Name == c.Name {
				t.Fatalf("case %q twice", c.Name)
			}
			if err := c.Validate(); err != nil {
				t.Fatalf("accepted case %s is invalid: %v", c.Name, err)
			}
			if _, err := c.Metadata(); err != nil && err.Error() == "" {
				t.Fatalf("case %s: empty error", c.Name)
			}
		}
	})
}
