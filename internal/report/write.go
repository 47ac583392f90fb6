package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"

	"github.com/kcheck-dev/kcheck/internal/compare"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
)

// WriteOptions tune WriteDir.
type WriteOptions struct {
	// Force overwrites files that exist; without it WriteDir refuses
	// before writing anything.
	Force bool
	// Plots draws the PNG plots (default true through DefaultWriteOptions).
	NoPlots  bool
	Markdown MarkdownOptions
}

// File names inside a report directory.
const (
	MarkdownFile = "report.md"
	JSONFile     = "report.json"
	PlotDir      = "plots"
)

// WriteDir writes a report into dir (created if needed): report.md
// (Markdown to paste into an issue), report.json (the bundle, which
// `kcheck report` re-renders) and plots/*.png. The report is rendered in
// memory, then written whole under the directory's lock (reportdir.go): a
// reader never sees half of it, two writers never mix theirs, nothing is
// written through a symbolic link inside dir, and without Force nothing
// that exists is replaced (WriteDir refuses before writing anything). It
// returns the paths it wrote.
func WriteDir(dir string, b Bundle, opt WriteOptions) ([]string, error) {
	if b.Format == 0 {
		b.Format = Format
	}
	files := map[string][]byte{}
	figs := figures{byCheck: map[int]map[string][]Figure{}}
	if !opt.NoPlots {
		figs = renderPlots(b, opt.Markdown, files)
	}
	var md bytes.Buffer
	if err := markdown(&md, b, figs, opt.Markdown); err != nil {
		return nil, err
	}
	files[MarkdownFile] = md.Bytes()
	js, err := json.Marshal(pruned(b, opt.Markdown))
	if err != nil {
		return nil, fmt.Errorf("report.json: %v", err)
	}
	files[JSONFile] = append(js, '\n')

	d, err := openReportDir(dir)
	if err != nil {
		return nil, err
	}
	defer d.close()
	if err := d.removeStale(); err != nil {
		return nil, err
	}
	if err := d.check(opt.Force); err != nil {
		return nil, err
	}
	return d.install(files, opt.Force)
}

// Preflight finds, before any work, what would make WriteDir refuse dir or
// fail in it: it creates dir when it is missing, and checks that kcheck can
// lock it and write into it, that plots/ is no symbolic link, and without
// force that no part of a report is there.
func Preflight(dir string, force bool) error {
	d, err := openReportDir(dir)
	if err != nil {
		return err
	}
	defer d.close()
	if err := d.removeStale(); err != nil {
		return err
	}
	if err := d.check(force); err != nil {
		return err
	}
	staging, err := d.stage()
	if err != nil {
		return err
	}
	return d.root.Remove(staging)
}

// maxPlots bounds the PNGs one report draws (each takes tens of
// milliseconds): far more than kcheck's own reports need (ten detailed
// items, two plots per output that fails), so that no report.json can make
// rendering take hours. A variable for the tests.
var maxPlots = 256

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// renderPlots draws the plots of the detailed items' failing (or, when all
// pass, every) checks and of the drift, into files. A plot that cannot be
// drawn becomes a figure that says why, so that one odd profile never costs
// the report.
func renderPlots(b Bundle, mo MarkdownOptions, files map[string][]byte) figures {
	figs := figures{byCheck: map[int]map[string][]Figure{}}
	const w, h = 7 * vg.Inch, 3.6 * vg.Inch
	add := func(name string, pngBytes []byte) string {
		rel := filepath.ToSlash(filepath.Join(PlotDir, name))
		files[rel] = pngBytes
		return rel
	}
	// figure renders one plot (a nil plot: nothing to draw).
	drawn := 0
	figure := func(name, what string, pl *plot.Plot, caption string, err error, render func(*plot.Plot) ([]byte, error)) *Figure {
		if err == nil && pl == nil {
			return nil
		}
		if err == nil && drawn >= maxPlots {
			err = fmt.Errorf("the report already holds %d plots, the most it draws", maxPlots)
		}
		var data []byte
		if err == nil {
			drawn++
			data, err = render(pl)
		}
		if err != nil {
			return &Figure{Caption: what, Err: err.Error()}
		}
		return &Figure{Path: add(name, data), Caption: caption}
	}
	used := map[string]bool{}
	for _, i := range detailed(b.Items, mo.MaxDetails) {
		it := b.Items[i]
		allPass := it.Result.Verdict == compare.Pass
		for _, c := range it.Result.Checks {
			if c.Verdict == compare.Pass && !allPass {
				continue
			}
			p := findProfile(it.Profiles, c.Tensor)
			if p == nil {
				p = profileFromSignature(c)
			}
			if p == nil {
				continue
			}
			// Names stay unique when two tensors sanitize alike ("a b", "a_b"),
			// and keep the form plotName expects.
			base := fmt.Sprintf("%d-%s", i+1, unsafeName.ReplaceAllString(c.Tensor, "_"))
			for k := 2; used[base]; k++ {
				base = fmt.Sprintf("%d-%s-%d", i+1, unsafeName.ReplaceAllString(c.Tensor, "_"), k)
			}
			used[base] = true
			pl, caption, err := positionPlot(*p, sigCoord(c))
			if f := figure(base+"-along.png", "error along a coordinate", pl, caption, err, func(pl *plot.Plot) ([]byte, error) { return pngOf(pl, w, h) }); f != nil {
				addFig(figs, i, c.Tensor, *f)
			}
			pl, caption, err = mapPlot(*p)
			if f := figure(base+"-map.png", "heat map", pl, caption, err, func(pl *plot.Plot) ([]byte, error) { return mapPNG(pl, p.Bitwise, w, 4.2*vg.Inch) }); f != nil {
				addFig(figs, i, c.Tensor, *f)
			}
		}
	}
	pl, caption, err := driftPlot(b.Diagnosis)
	figs.drift = figure("drift.png", "drift", pl, caption, err, func(pl *plot.Plot) ([]byte, error) { return pngOf(pl, w, h) })
	return figs
}

func addFig(f figures, i int, tensor string, fig Figure) {
	if f.byCheck[i] == nil {
		f.byCheck[i] = map[string][]Figure{}
	}
	f.byCheck[i][tensor] = append(f.byCheck[i][tensor], fig)
}

// pruned keeps the profiles the report draws (the local profiles of the
// detailed items' drawn checks): report.json stays small, and re-rendering
// it draws the same plots.
func pruned(b Bundle, mo MarkdownOptions) Bundle {
	keep := map[int]bool{}
	for _, i := range detailed(b.Items, mo.MaxDetails) {
		keep[i] = true
	}
	items := make([]Item, len(b.Items))
	for i, it := range b.Items {
		items[i] = it.Trimmed(keep[i])
	}
	b.Items = items
	return b
}

// Trimmed keeps the profiles a report draws: the local profiles of the
// checks that did not pass (of every check when the item passed), and none
// at all unless keep. A long run trims as it goes, so that a thousand
// passing cases do not hold a thousand sets of profiles.
func (it Item) Trimmed(keep bool) Item {
	var ps []Profile
	if keep {
		for _, c := range it.Result.Checks {
			if c.Verdict == compare.Pass && it.Result.Verdict != compare.Pass {
				continue
			}
			if p := findProfile(it.Profiles, c.Tensor); p != nil {
				ps = append(ps, *p)
			}
		}
	}
	it.Profiles = ps
	return it
}

// findProfile returns the local profile of a check's tensor.
func findProfile(ps []Profile, tensor string) *Profile {
	for i := range ps {
		if ps[i].Tensor == tensor && ps[i].Kind != "propagated" {
			return &ps[i]
		}
	}
	return nil
}
