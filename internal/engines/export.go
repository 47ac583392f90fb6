package engines

import (
	"encoding/json"
	"sort"
)

// ExportedEngine is an engine's table as data, for the other side of the
// bridge: the Python workers (python/kcheck/engines.json) map the contract
// onto an engine's call with the same names, values and defaults that
// `--from ENGINE` uses to read that engine's captures. Layout fixes are
// code, so only their descriptions travel.
type ExportedEngine struct {
	Name     string                       `json:"name"`
	Summary  string                       `json:"summary"`
	Defaults map[string]string            `json:"defaults"`
	Values   map[string]map[string]string `json:"values,omitempty"`
	Refused  map[string]map[string]string `json:"refused,omitempty"`
	Kernels  map[string]ExportedKernel    `json:"kernels"`
}

// ExportedKernel is one kernel's part of an ExportedEngine.
type ExportedKernel struct {
	Tensors  map[string]string `json:"tensors,omitempty"`
	Params   map[string]string `json:"params,omitempty"`
	Defaults map[string]string `json:"defaults,omitempty"`
	Fixes    []string          `json:"fixes,omitempty"`
	Identify []string          `json:"identify,omitempty"`
}

// ExportJSON returns every engine's table as indented JSON, engines sorted
// by name (encoding/json sorts map keys), so the file is stable.
func ExportJSON() ([]byte, error) {
	var out []ExportedEngine
	for _, name := range Names() {
		e := registry[name]
		x := ExportedEngine{Name: e.Name, Summary: e.Summary, Defaults: e.Defaults, Values: e.Values, Refused: e.Refused, Kernels: map[string]ExportedKernel{}}
		for kn, k := range e.Kernels {
			ek := ExportedKernel{Tensors: k.Tensors, Params: k.Params, Defaults: k.Defaults, Identify: append([]string(nil), k.Identify...)}
			for _, f := range k.Fixes {
				ek.Fixes = append(ek.Fixes, f.Doc)
			}
			sort.Strings(ek.Identify)
			x.Kernels[kn] = ek
		}
		out = append(out, x)
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
