package docs

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The repository's contract reference, which code and documents cite by
// section: `reference/CONTRACTS.md §3.6`. The sign § is used for nothing
// else here, so every §N in a source or document is such a citation.
const contracts = "reference/CONTRACTS.md"

var (
	// heading is a numbered section of the reference: "### §3.6.1 ...".
	heading = regexp.MustCompile(`^#{1,6} §(\d+(?:\.\d+)*) `)
	// cited is a citation of a section.
	cited = regexp.MustCompile(`§(\d+(?:\.\d+)*)`)
	// oldStyle are the citations of the shared specification outside the
	// repository, which docs12-cite.sh rewrote: none may come back.
	oldStyle = []*regexp.Regexp{
		regexp.MustCompile(`spec section \d`),
		regexp.MustCompile(`\bspec \d`),
		regexp.MustCompile(`(^|[^/])CONTRACTS\.md (section )?\d`),
	}
	// oldPath is the shared specification's path, which code may not cite
	// (a document may name it as where the contracts came from).
	oldPath = regexp.MustCompile(`spec/CONTRACTS\.md`)
)

// sourceFile reports whether path is a file whose citations are checked,
// and whether it is code (as against a document).
func sourceFile(path string) (checked, code bool) {
	base := filepath.Base(path)
	switch filepath.Ext(path) {
	case ".go", ".cu", ".cuh", ".h", ".s", ".py", ".sh", ".mk":
		return true, true
	case ".md":
		return true, false
	}
	return base == "Makefile", base == "Makefile"
}

// sections returns the section numbers reference/CONTRACTS.md defines.
func sections(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, contracts))
	if err != nil {
		t.Fatal(err)
	}
	secs := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if m := heading.FindStringSubmatch(l); m != nil {
			if secs[m[1]] {
				t.Errorf("%s numbers two sections §%s", contracts, m[1])
			}
			secs[m[1]] = true
		}
	}
	if len(secs) < 20 {
		t.Fatalf("%s has %d numbered sections: is the heading form (## §N title) still the same?", contracts, len(secs))
	}
	return secs
}

// citationProblems returns what is wrong with the citations in one file's
// text: a § that the reference does not have, or a citation of the shared
// specification.
func citationProblems(text string, code bool, secs map[string]bool) []string {
	var probs []string
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		for _, m := range cited.FindAllStringSubmatch(l, -1) {
			if !secs[m[1]] {
				probs = append(probs, lineRef(n, "cites §"+m[1]+", which "+contracts+" does not have"))
			}
		}
		for _, re := range oldStyle {
			if loc := re.FindString(l); loc != "" {
				probs = append(probs, lineRef(n, "cites the shared specification (\""+strings.TrimSpace(loc)+"\"): cite "+contracts+" §N"))
			}
		}
		if code && oldPath.MatchString(l) {
			probs = append(probs, lineRef(n, "cites spec/CONTRACTS.md, outside the repository: cite "+contracts+" §N"))
		}
	}
	return probs
}

func lineRef(n int, s string) string { return "line " + strconv.Itoa(n) + ": " + s }

// TestCitationsExist: every §N cited anywhere in the repository's sources
// and documents (reference/CONTRACTS.md's own cross-references included) is
// a numbered section of reference/CONTRACTS.md, and nothing cites the shared
// specification the code used to cite ("spec section 4", "spec 3.6").
func TestCitationsExist(t *testing.T) {
	secs := sections(t)
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch rel {
			case ".git", "bin", "build", "python/.venv", "cuda/ptx", "cuda/build", "internal/docs":
				return filepath.SkipDir // not sources, or this test's own patterns
			}
			if d.Name() == "testdata" || d.Name() == "__pycache__" || d.Name() == "node_modules" {
				return filepath.SkipDir
			}
			return nil
		}
		checked, code := sourceFile(path)
		if !checked || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.IndexByte(b, 0) >= 0 {
			return nil // binary
		}
		files++
		for _, p := range citationProblems(string(b), code, secs) {
			t.Errorf("%s %s", rel, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("checked %d files: is the walk still rooted at the repository?", files)
	}
}

// The checker itself, on planted citations: a section that does not exist,
// each old form, and the shared spec's path in code but not in a document.
func TestCitationProblems(t *testing.T) {
	secs := map[string]bool{"3": true, "3.6": true, "3.6.1": true, "9": true}
	for _, tc := range []struct {
		text string
		code bool
		want string // "" = no problem
	}{
		{"// see reference/CONTRACTS.md §3.6.1.", true, ""},
		{"// reference/CONTRACTS.md §3.6, §9 (the worker protocol)", true, ""},
		{"// reference/CONTRACTS.md §3.11", true, "cites §3.11, which"},
		{"// the split count (reference/CONTRACTS.md §8.1)", true, "cites §8.1, which"},
		{"// the pipelines of spec section 4", true, "cites the shared specification (\"spec section 4\")"},
		{"// S from the shape (spec 8.1)", true, "cites the shared specification (\"spec 8\")"},
		{"// kv_cache_gather: CONTRACTS.md 3.4 and 3.5", true, "cites the shared specification"},
		{"// in the format of ../shared/spec/CONTRACTS.md", true, "cites spec/CONTRACTS.md, outside the repository"},
		{"began as the shared specification (`../shared/spec/CONTRACTS.md`)", false, ""},
		{"a spec test and the spec's rules", true, ""},
	} {
		probs := citationProblems(tc.text, tc.code, secs)
		got := strings.Join(probs, "; ")
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%q: problems %q, want %q", tc.text, got, tc.want)
		}
	}
}
