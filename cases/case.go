package cases

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kcheck-dev/kcheck/internal/bounded"
)

// Case is one runnable configuration of one kernel. Zero fields take the
// kernel's defaults; Params go into the capture's metadata as they are.
type Case struct {
	Name   string `json:"name"`
	Kernel string `json:"kernel"`
	Doc    string `json:"doc,omitempty"`
	Preset string `json:"preset,omitempty"`
	TP     int    `json:"tp,omitempty"`
	// Heads overrides the preset's heads (a shrunk case).
	Heads int `json:"heads,omitempty"`
	// Latent and Rope override the preset's L and R (small hand-checkable
	// cases; the fp8_ds_mla layout needs 512 and 64).
	Latent       int               `json:"latent,omitempty"`
	Rope         int               `json:"rope,omitempty"`
	Batch        int               `json:"batch,omitempty"`
	SQ           int               `json:"s_q,omitempty"`
	SeqLens      []int             `json:"seq_lens,omitempty"`
	PageSize     int               `json:"page_size,omitempty"`
	KVCacheDType string            `json:"kv_cache_dtype,omitempty"`
	Splits       int               `json:"splits,omitempty"`
	M            int               `json:"m,omitempty"`
	N            int               `json:"n,omitempty"`
	K            int               `json:"k,omitempty"`
	TopK         int               `json:"topk,omitempty"`
	Seed         uint64            `json:"seed,omitempty"`
	Params       map[string]string `json:"params,omitempty"`
	Tags         []string          `json:"tags,omitempty"`
}

// HasTag reports whether c carries tag (for example "long").
func (c Case) HasTag(tag string) bool {
	for _, t := range c.Tags {
		if t == tag {
			return true
		}
	}
	return false
}

// Family expands into cases: every combination of Matrix's values applied
// to Base. Matrix keys are Case JSON field names, plus "context", whose
// values are expressions in the page size P and split count S ("1", "P-1",
// "P+1", "2P", "131072") setting every request's seq_len. Name is a
// template: {field} is replaced by that field's value.
type Family struct {
	Name   string           `json:"name"`
	Doc    string           `json:"doc,omitempty"`
	Base   map[string]any   `json:"base"`
	Matrix map[string][]any `json:"matrix,omitempty"`
	Skip   []map[string]any `json:"skip,omitempty"`
}

// File is a case file: explicit cases and families.
type File struct {
	Cases    []Case   `json:"cases,omitempty"`
	Families []Family `json:"families,omitempty"`
}

//go:embed catalog.json
var catalogJSON []byte

// Catalog returns the built-in catalog, expanded and sorted by name.
func Catalog() ([]Case, error) { return Parse(catalogJSON, "catalog.json") }

// MaxFileSize bounds a case file's bytes: 100,000 explicit cases (MaxCases)
// take about 20 MB, the catalog 6 KB. What a path names may never end
// (/dev/zero), and a case file is read whole before it is parsed.
const MaxFileSize = 32 << 20

// ReadTimeout bounds the time a case file may take to arrive: a file is
// read in milliseconds, so a pipe that takes longer has stalled.
const ReadTimeout = time.Minute

// Load reads a user case file in the catalog's format.
func Load(path string) ([]Case, error) { return LoadContext(context.Background(), path) }

// LoadContext is Load under ctx, within MaxFileSize and ReadTimeout: a
// named pipe with no writer, a stalled one or an endless stream gives an
// error naming the file.
func LoadContext(ctx context.Context, path string) ([]Case, error) {
	ctx, cancel := context.WithTimeout(ctx, ReadTimeout)
	defer cancel()
	b, err := bounded.ReadFile(ctx, path, bounded.Limit{Bytes: MaxFileSize, What: "the limit of case files"})
	if err != nil {
		return nil, err
	}
	return Parse(b, path)
}

// MaxCases bounds how many cases one file may list and expand to. A
// family's matrix multiplies out (ten keys of ten values are ten billion
// cases), so a few hundred bytes could otherwise ask for more cases than
// memory holds; the catalog has a few hundred.
const MaxCases = 100000

// Parse decodes and expands a case file; name is used in error messages.
func Parse(b []byte, name string) ([]Case, error) {
	var f File
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%s: %v", name, err)
	}
	if len(f.Cases) > MaxCases {
		return nil, fmt.Errorf("%s: more than %d cases (%d listed); split the file", name, MaxCases, len(f.Cases))
	}
	out := append([]Case(nil), f.Cases...)
	seqLens := MaxSeqLens // what the families' contexts may still expand to
	for _, c := range f.Cases {
		seqLens -= len(c.SeqLens)
	}
	for _, fam := range f.Families {
		cs, err := fam.expand(&seqLens)
		if err != nil {
			return nil, fmt.Errorf("%s: family %q: %v", name, fam.Name, err)
		}
		out = append(out, cs...)
		if len(out) > MaxCases {
			return nil, fmt.Errorf("%s: more than %d cases (family %q brings the total to %d); split the file", name, MaxCases, fam.Name, len(out))
		}
	}
	seen := map[string]bool{}
	for i, c := range out {
		if c.Name == "" || c.Kernel == "" {
			return nil, fmt.Errorf("%s: case %d has no name or no kernel", name, i)
		}
		if seen[c.Name] {
			return nil, fmt.Errorf("%s: case name %q appears twice", name, c.Name)
		}
		seen[c.Name] = true
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("%s: case %s: %v", name, c.Name, err)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// MaxSeqLens bounds the seq_lens a file's cases list in all (32 MiB of
// them). A family's context expression sets every request's seq_len, so
// one "batch": 100000000 would otherwise fill a list of that many at
// parse time, before any memory bound is asked; a case with a batch but no
// context lists none (its default contexts are made by the generator,
// after the memory estimate has accepted it).
const MaxSeqLens = 1 << 22

// expand makes the family's cases; seqLens is how many seq_lens their
// context expressions may still set, and is decremented by what they do.
func (fam Family) expand(seqLens *int) ([]Case, error) {
	keys := make([]string, 0, len(fam.Matrix))
	for k := range fam.Matrix {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	// Refuse before expanding: the product of the value counts, checked at
	// every step so it cannot overflow.
	n := 1
	for _, k := range keys {
		n *= len(fam.Matrix[k])
		if n > MaxCases {
			return nil, fmt.Errorf("matrix expands to more than %d cases (%d keys)", MaxCases, len(keys))
		}
	}
	var out []Case
	var rec func(i int, cur map[string]any) error
	rec = func(i int, cur map[string]any) error {
		if i == len(keys) {
			if fam.skipped(cur) {
				return nil
			}
			c, err := fam.build(cur, seqLens)
			if err != nil {
				return err
			}
			out = append(out, c)
			return nil
		}
		for _, v := range fam.Matrix[keys[i]] {
			next := make(map[string]any, len(cur)+1)
			for k, x := range cur {
				next[k] = x
			}
			if obj, ok := v.(map[string]any); ok {
				// A matrix value that is an object sets several fields at
				// once; its "label" stands for it in the name.
				for field, fv := range obj {
					if field != "label" {
						next[field] = fv
					}
				}
				next[labelKey+keys[i]] = fmt.Sprint(obj["label"])
			} else {
				next[keys[i]] = v
			}
			if err := rec(i+1, next); err != nil {
				return err
			}
		}
		return nil
	}
	base := map[string]any{}
	for k, v := range fam.Base {
		base[k] = v
	}
	return out, rec(0, base)
}

func (fam Family) skipped(cur map[string]any) bool {
	for _, s := range fam.Skip {
		all := true
		for k, v := range s {
			if fmt.Sprint(cur[k]) != fmt.Sprint(v) {
				all = false
			}
		}
		if all {
			return true
		}
	}
	return false
}

// labelKey prefixes the name label of an object-valued matrix entry.
const labelKey = "\x00label:"

// caseFields are the JSON names of Case's fields; any other matrix key is a
// kernel parameter and goes into Params.
var caseFields = func() map[string]bool {
	m := map[string]bool{}
	t := reflect.TypeOf(Case{})
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		m[name] = true
	}
	return m
}()

func (fam Family) build(fields map[string]any, seqLens *int) (Case, error) {
	plain := map[string]any{}
	params := map[string]string{}
	labels := map[string]string{}
	var ctx string
	for k, v := range fields {
		if name, ok := strings.CutPrefix(k, labelKey); ok {
			labels[name] = fmt.Sprint(v)
			continue
		}
		labels[k] = fmt.Sprint(v)
		switch {
		case k == "context":
			ctx = fmt.Sprint(v)
		case caseFields[k]:
			plain[k] = v
		default:
			params[k] = fmt.Sprint(v)
		}
	}
	b, _ := json.Marshal(plain)
	var c Case
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, err
	}
	if len(params) > 0 {
		if c.Params == nil {
			c.Params = map[string]string{}
		}
		for k, v := range params {
			c.Params[k] = v
		}
	}
	if ctx != "" {
		page := c.PageSize
		if page == 0 {
			page = 64
		}
		n, err := contextExpr(ctx, page, c.Splits)
		if err != nil {
			return c, err
		}
		batch := c.Batch
		if batch == 0 {
			batch = 1
		}
		if batch < 0 {
			return c, fmt.Errorf("batch = %d is negative", batch)
		}
		if batch > *seqLens {
			return c, fmt.Errorf("context %q for each of %d requests: more than %d seq_lens in the file", ctx, batch, MaxSeqLens)
		}
		*seqLens -= batch
		c.SeqLens = make([]int, batch)
		for i := range c.SeqLens {
			c.SeqLens[i] = n
		}
	}
	name := fam.Name
	for k, v := range labels {
		name = strings.ReplaceAll(name, "{"+k+"}", v)
	}
	c.Name = name
	if c.Doc == "" {
		c.Doc = fam.Doc
	}
	return c, nil
}

// contextExpr evaluates a sum of terms "aP", "aS" and integers ("2P+1",
// "P-1", "S", "131072"), P the page size and S the split count. A term or
// sum that does not fit an int is refused: wrapped around, 2^58+1 pages of
// 64 tokens would read as a context of 64.
func contextExpr(e string, p, s int) (int, error) {
	total := 0
	for _, term := range strings.Split(strings.ReplaceAll(e, "-", "+-"), "+") {
		if term == "" {
			continue
		}
		unit := 1
		coef := term
		switch {
		case strings.HasSuffix(term, "P"):
			unit, coef = p, strings.TrimSuffix(term, "P")
		case strings.HasSuffix(term, "S"):
			unit, coef = s, strings.TrimSuffix(term, "S")
		}
		a := 1
		switch coef {
		case "":
		case "-":
			a = -1
		default:
			v, err := strconv.Atoi(coef)
			if errors.Is(err, strconv.ErrRange) {
				return 0, fmt.Errorf("context %q: term %q overflows a 64-bit integer", e, term)
			}
			if err != nil {
				return 0, fmt.Errorf("context %q: cannot read term %q", e, term)
			}
			a = v
		}
		v, ok := mulInt(a, unit)
		if ok {
			total, ok = addInt(total, v)
		}
		if !ok {
			return 0, fmt.Errorf("context %q overflows a 64-bit integer (P = %d, S = %d)", e, p, s)
		}
	}
	if total < 0 {
		return 0, fmt.Errorf("context %q is negative (P = %d, S = %d)", e, p, s)
	}
	return total, nil
}

// mulInt is a*b, ok = false when it overflows.
func mulInt(a, b int) (int, bool) {
	if a == 0 || b == 0 {
		return 0, true
	}
	c := a * b
	if c/b != a || (a == -1 && b == math.MinInt) || (b == -1 && a == math.MinInt) {
		return 0, false
	}
	return c, true
}

// addInt is a+b, ok = false when it overflows.
func addInt(a, b int) (int, bool) {
	c := a + b
	if (b > 0 && c < a) || (b < 0 && c > a) {
		return 0, false
	}
	return c, true
}
