package report

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kcheck-dev/kcheck/internal/compare"
)

// plotsIn lists plots/*.png of a report directory, and the plots its
// report.md links.
func plotsIn(t *testing.T, dir string) (have, linked []string) {
	t.Helper()
	pngs, _ := filepath.Glob(filepath.Join(dir, PlotDir, "*"))
	for _, p := range pngs {
		have = append(have, filepath.Base(p))
	}
	for _, m := range regexp.MustCompile(`\]\(plots/([^)]+)\)`).FindAllStringSubmatch(readFile(t, filepath.Join(dir, MarkdownFile)), -1) {
		linked = append(linked, m[1])
	}
	sort.Strings(linked)
	return have, linked
}

// A symbolic link inside the report directory never leads a write out of
// it: plots/ pointing elsewhere is refused, by Preflight (before any check)
// and by WriteDir, with --force too, and the file it points at is kept;
// report.md linking elsewhere is replaced as an entry with --force, never
// written through.
func TestWriteDirDoesNotFollowLinks(t *testing.T) {
	b := fixtureBundle(t, threeFixtures[1])
	outside := t.TempDir()
	victim := filepath.Join(outside, "1-out-along.png")
	os.WriteFile(victim, []byte("precious"), 0o644)
	dir := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(dir, PlotDir)); err != nil {
		t.Fatal(err)
	}
	for _, force := range []bool{false, true} {
		if err := Preflight(dir, force); err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Errorf("Preflight (force %v): %v", force, err)
		}
		// Drawing the plots changes nothing here (they are slow under -race).
		if _, err := WriteDir(dir, b, WriteOptions{Force: force, NoPlots: true}); err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Errorf("WriteDir (force %v): %v", force, err)
		}
	}
	if got := readFile(t, victim); got != "precious" {
		t.Errorf("the file plots/ links to now holds %.20q", got)
	}
	if _, err := os.Lstat(filepath.Join(dir, MarkdownFile)); err == nil {
		t.Error("report.md written beside a refused plots/")
	}

	dir2 := t.TempDir()
	target := filepath.Join(outside, "notes.md")
	os.WriteFile(target, []byte("precious"), 0o644)
	os.Symlink(target, filepath.Join(dir2, MarkdownFile))
	if _, err := WriteDir(dir2, b, WriteOptions{NoPlots: true}); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("WriteDir over a linked report.md without --force: %v", err)
	}
	if _, err := WriteDir(dir2, b, WriteOptions{NoPlots: true, Force: true}); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, target); got != "precious" {
		t.Errorf("--force wrote through report.md's link: %.20q", got)
	}
	if fi, err := os.Lstat(filepath.Join(dir2, MarkdownFile)); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("report.md is not a regular file: %v", err)
	}
}

// A report replaced with --force is replaced whole: no plot of the earlier
// report stays beside the new one. Two writers at once each write a whole
// report, one after the other; the directory holds one of them, unmixed.
func TestWriteDirWritesWhole(t *testing.T) {
	// Small profiles: one plot a failing output (PNGs are slow under -race).
	item := func(file string) Item {
		it := Item{Result: failingResult("out"), Profiles: []Profile{along("token", 0, []float64{1, 2, 3}, []float64{1, 1, 1})}}
		it.Result.File = file
		return it
	}
	big := Bundle{Items: []Item{item("a"), item("b")}}                   // plots 1-out-along.png and 2-out-along.png
	small := Bundle{Items: []Item{item("c")}, Title: "the small report"} // 1-out-along.png only
	dir := t.TempDir()
	if _, err := WriteDir(dir, big, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := WriteDir(dir, small, WriteOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	have, linked := plotsIn(t, dir)
	if strings.Join(have, " ") != strings.Join(linked, " ") {
		t.Errorf("plots/ holds %v, report.md links %v", have, linked)
	}

	for round := 0; round < 2; round++ {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, b := range []Bundle{big, small} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = WriteDir(dir, b, WriteOptions{Force: true})
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		have, linked := plotsIn(t, dir)
		md, js := readFile(t, filepath.Join(dir, MarkdownFile)), readFile(t, filepath.Join(dir, JSONFile))
		if strings.Join(have, " ") != strings.Join(linked, " ") ||
			strings.HasPrefix(md, "## the small report") != strings.Contains(js, `"title":"the small report"`) {
			t.Fatalf("round %d: writers mixed: plots %v, linked %v, report.md %.40q", round, have, linked, md)
		}
	}
}

// A writer waits for another that holds the directory's lock, and gives up
// with a message after lockWait.
func TestWriteDirWaitsForTheLock(t *testing.T) {
	defer func(w time.Duration) { lockWait = w }(lockWait)
	lockWait = 200 * time.Millisecond
	b := fixtureBundle(t, threeFixtures[1])
	dir := t.TempDir()
	other, err := openReportDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := WriteDir(dir, b, WriteOptions{NoPlots: true}); err == nil || !strings.Contains(err.Error(), "another kcheck") {
		other.close()
		t.Fatalf("WriteDir while another holds the lock: %v", err)
	}
	other.close()
	if _, err := WriteDir(dir, b, WriteOptions{NoPlots: true}); err != nil {
		t.Fatalf("WriteDir after the lock is released: %v", err)
	}
}

// What a killed writer leaves (a staging directory, or the temporary files
// of older versions) is removed by the next one.
func TestWriteDirRemovesWhatKilledWritersLeft(t *testing.T) {
	b := fixtureBundle(t, threeFixtures[1])
	dir := t.TempDir()
	left := []string{
		stagingPrefix + "0123456789abcdef/report.md",
		".report.md.tmp-123456",
		".report.json.tmp-7",
		"plots/.1-out-along.png.tmp-42",
	}
	for _, l := range left {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, l)), 0o755)
		os.WriteFile(filepath.Join(dir, l), []byte("half"), 0o644)
	}
	keep := filepath.Join(dir, ".my-notes.tmp-1") // not a name kcheck writes
	os.WriteFile(keep, []byte("mine"), 0o644)
	if _, err := WriteDir(dir, b, WriteOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	for _, l := range left {
		if _, err := os.Lstat(filepath.Join(dir, l)); err == nil {
			t.Errorf("%s left in place", l)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, stagingPrefix+"0123456789abcdef")); err == nil {
		t.Error("staging directory left in place")
	}
	if readFile(t, keep) != "mine" {
		t.Error("a file kcheck did not write was removed")
	}
	var stray []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && strings.Contains(p, "tmp-") && p != keep {
			stray = append(stray, p)
		}
		return nil
	})
	if len(stray) > 0 {
		t.Errorf("temporary files after a write: %v", stray)
	}
}

// Problems of the destination are found by Preflight, before any check:
// a file where the directory should be, a plots/ that is a file or holds
// files kcheck did not write (refused even with --force, never deleted).
func TestPreflight(t *testing.T) {
	tmp := t.TempDir()
	file := filepath.Join(tmp, "file")
	os.WriteFile(file, nil, 0o644)
	plotsFile := filepath.Join(tmp, "pf")
	os.MkdirAll(plotsFile, 0o755)
	os.WriteFile(filepath.Join(plotsFile, PlotDir), nil, 0o644)
	foreign := filepath.Join(tmp, "foreign")
	os.MkdirAll(filepath.Join(foreign, PlotDir), 0o755)
	os.WriteFile(filepath.Join(foreign, PlotDir, "1-out-along.png"), nil, 0o644)
	os.WriteFile(filepath.Join(foreign, PlotDir, "notes.txt"), []byte("mine"), 0o644)
	tests := []struct {
		dir   string
		force bool
		want  string
	}{
		{file, false, "not a directory"},
		{filepath.Join(file, "sub"), false, "not a directory"},
		{plotsFile, true, "plots is not a directory"},
		{foreign, false, "plots exists: not overwriting it (use --force)"},
		{foreign, true, "notes.txt was not written by kcheck"},
		{filepath.Join(tmp, "new", "dir"), false, ""},
	}
	for _, tc := range tests {
		err := Preflight(tc.dir, tc.force)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Preflight(%s, force %v) = %v, want %q", tc.dir, tc.force, err, tc.want)
		}
	}
	if readFile(t, filepath.Join(foreign, PlotDir, "notes.txt")) != "mine" {
		t.Error("a file in plots/ was touched")
	}
	if os.Geteuid() != 0 { // root writes anywhere
		ro := filepath.Join(tmp, "ro")
		os.MkdirAll(ro, 0o555)
		if err := Preflight(ro, false); err == nil {
			t.Error("Preflight of a read-only directory passed")
		}
	}
}

// report.md reads whole without its plots and names each one, so that the
// PNGs can be attached beside it in an issue: a line says how many there
// are and where, and each figure is numbered in order with its file name
// in its caption, outside the image link a pasted report cannot show. Two
// tensors whose names sanitize alike get two files.
func TestMarkdownNamesItsPlots(t *testing.T) {
	// Two failing items, the second with three outputs whose names
	// sanitize alike ("out", then "out!" and "out?" as "out_"), one with a
	// heat map too.
	p := along("token", 0, []float64{1, 2, 3}, []float64{1, 1, 1})
	b := Bundle{Items: []Item{{Result: failingResult("out"), Profiles: []Profile{p}}, {Result: failingResult("out"), Profiles: []Profile{p}}}}
	it := &b.Items[1]
	it.Profiles[0].Map = grid([][]float64{{1, 2}, {3, 4}})
	for _, name := range []string{"out!", "out?"} {
		it.Result.Checks = append(it.Result.Checks, compare.Check{Tensor: name, Verdict: compare.Fail})
		q := p
		q.Tensor = name
		it.Profiles = append(it.Profiles, q)
	}
	dir := t.TempDir()
	if _, err := WriteDir(dir, b, WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	md := readFile(t, filepath.Join(dir, MarkdownFile))
	have, _ := plotsIn(t, dir)
	if want := fmt.Sprintf("*The %d plots below are PNG files in `plots/` beside this report", len(have)); !strings.Contains(md, want) {
		t.Errorf("report.md lacks %q", want)
	}
	// Without the image links, every file is still named, figure by figure.
	prose := regexp.MustCompile(`!\[[^\]]*\]\([^)]*\)`).ReplaceAllString(md, "")
	figs := regexp.MustCompile("\\*Figure (\\d+), `([^`]+)`: ").FindAllStringSubmatch(prose, -1)
	var named []string
	for i, f := range figs {
		if f[1] != fmt.Sprint(i+1) {
			t.Errorf("figure %s is the %d-th", f[1], i+1)
		}
		named = append(named, f[2])
	}
	sort.Strings(named)
	if strings.Join(named, " ") != strings.Join(have, " ") {
		t.Errorf("captions name %v, plots/ holds %v", named, have)
	}
	for _, want := range []string{"2-out-map.png", "2-out_-along.png", "2-out_-2-along.png"} {
		if !slices.Contains(have, want) {
			t.Errorf("plots/ lacks %s: %v", want, have)
		}
	}
}
