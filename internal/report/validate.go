package report

import "fmt"

// What Load accepts. A report.json is an input like any other (`kcheck
// report` renders whatever file it is given), so before anything is drawn
// its profiles, heat maps and decode steps are checked for what the
// renderer relies on: parallel slices of one length, ascending coordinate
// values of a size a tensor can have, heat maps no larger than the ones
// kcheck makes. The plots check the same again, as a second line for
// profiles made in-process.

// check reports what makes the bundle impossible to render.
func (b *Bundle) check() error {
	for i := range b.Items {
		if err := b.Items[i].check(); err != nil {
			return fmt.Errorf("item %d: %v", i+1, err)
		}
	}
	if d := b.Diagnosis; d != nil {
		if err := d.check(); err != nil {
			return fmt.Errorf("diagnosis: %v", err)
		}
	}
	return nil
}

// check reports what makes an item impossible to render: its profiles, and
// the signature groups a plot is drawn from when it has none.
func (it *Item) check() error {
	for j := range it.Profiles {
		if err := it.Profiles[j].check(); err != nil {
			return fmt.Errorf("%q: profile %d (%q): %v", it.Result.File, j+1, it.Profiles[j].Tensor, err)
		}
	}
	for _, c := range it.Result.Checks {
		if s := c.Signature; s != nil {
			for _, g := range s.Groups {
				if err := coordValue(g.Value); err != nil {
					return fmt.Errorf("%q: output %q: signature group %v", it.Result.File, c.Tensor, err)
				}
			}
		}
	}
	return nil
}

// coordValue refuses a coordinate value no tensor can have (see
// maxCoordMagnitude).
func coordValue(v int) error {
	if v < -maxCoordMagnitude || v > maxCoordMagnitude {
		return fmt.Errorf("value %d is beyond ±2^40, more than any tensor's elements", v)
	}
	return nil
}

// check reports what makes a profile impossible to draw.
func (p *Profile) check() error {
	if p.Axes < 0 || p.Axes > len(p.Coords) {
		return fmt.Errorf("axes = %d, but %d coordinates", p.Axes, len(p.Coords))
	}
	if p.Sampled < 0 {
		return fmt.Errorf("sampled = %d is negative", p.Sampled)
	}
	if p.PageSize < 0 || p.PageSize > maxCoordMagnitude {
		return fmt.Errorf("page_size = %d is not a page size", p.PageSize)
	}
	for _, s := range p.SplitStarts {
		if err := coordValue(s); err != nil {
			return fmt.Errorf("split start %v", err)
		}
	}
	for i := range p.Coords {
		if err := p.Coords[i].check(); err != nil {
			return fmt.Errorf("coordinate %q: %v", p.Coords[i].Name, err)
		}
	}
	if p.Map != nil {
		if err := p.Map.check(); err != nil {
			return fmt.Errorf("heat map: %v", err)
		}
	}
	return nil
}

// check reports what makes a coordinate profile impossible to draw: one
// maximum, mean, failing count and element count for each value, values
// ascending, at most maxValues of them.
func (c *CoordProfile) check() error {
	n := len(c.Values)
	if n > maxValues {
		return fmt.Errorf("%d values, more than the %d a profile keeps", n, maxValues)
	}
	if len(c.Max) != n || len(c.Mean) != n || len(c.Failing) != n || len(c.Count) != n {
		return fmt.Errorf("%d values but %d maxima, %d means, %d failing counts and %d element counts", n, len(c.Max), len(c.Mean), len(c.Failing), len(c.Count))
	}
	if c.Width < 0 {
		return fmt.Errorf("width = %d is negative", c.Width)
	}
	if err := ascending(c.Values); err != nil {
		return err
	}
	for j := range c.Values {
		if c.Failing[j] < 0 || c.Count[j] < 0 {
			return fmt.Errorf("value %d: negative count (%d failing of %d)", c.Values[j], c.Failing[j], c.Count[j])
		}
	}
	return nil
}

// ascending refuses values out of order, repeated or out of range.
func ascending(vals []int) error {
	for j, v := range vals {
		if err := coordValue(v); err != nil {
			return err
		}
		if j > 0 && v <= vals[j-1] {
			return fmt.Errorf("values not ascending: %d after %d", v, vals[j-1])
		}
	}
	return nil
}

// check reports what makes a heat map impossible to draw: a row of
// Max for each Y value, a cell in it for each X value, at most maxGrid
// values a side.
func (g *Grid) check() error {
	if len(g.XVals) > maxGrid || len(g.YVals) > maxGrid {
		return fmt.Errorf("%d x %d cells, more than the %d a side a heat map keeps", len(g.YVals), len(g.XVals), maxGrid)
	}
	if len(g.Max) != len(g.YVals) {
		return fmt.Errorf("%d %s values but %d rows", len(g.YVals), g.Y, len(g.Max))
	}
	for i, row := range g.Max {
		if len(row) != len(g.XVals) {
			return fmt.Errorf("row %d has %d cells for %d %s values", i, len(row), len(g.XVals), g.X)
		}
	}
	if g.XWidth < 0 || g.YWidth < 0 {
		return fmt.Errorf("negative bin width (%d, %d)", g.XWidth, g.YWidth)
	}
	if err := ascending(g.XVals); err != nil {
		return fmt.Errorf("%s: %v", g.X, err)
	}
	if err := ascending(g.YVals); err != nil {
		return fmt.Errorf("%s: %v", g.Y, err)
	}
	return nil
}

// check reports decode steps no simulation makes: step numbers, prompts
// and context lengths beyond what a tensor can index.
func (d *Diagnosis) check() error {
	for i, s := range d.Steps {
		for _, v := range []int{s.Step, s.Prompt, s.ContextLen} {
			if err := coordValue(v); err != nil {
				return fmt.Errorf("step %d: %v", i+1, err)
			}
		}
	}
	for _, f := range []struct {
		name string
		v    *int
	}{{"first_step", d.FirstStep}, {"first_context_len", d.FirstContextLen}} {
		if f.v != nil {
			if err := coordValue(*f.v); err != nil {
				return fmt.Errorf("%s: %v", f.name, err)
			}
		}
	}
	return nil
}
