package kernel

import "github.com/kcheck-dev/kcheck/reference/tensor"

// ParamKind is the type of a kernel parameter's value.
type ParamKind int

// The parameter kinds. Metadata holds every value as a string (spec
// section 1); the kind says how it is read.
const (
	ParamString ParamKind = iota
	ParamFloat
	ParamInt
	ParamBool
	ParamEnum
)

var paramKindNames = [...]string{"string", "float", "int", "bool", "enum"}

func (k ParamKind) String() string {
	if int(k) < len(paramKindNames) {
		return paramKindNames[k]
	}
	return "unknown"
}

// ParamSpec documents one parameter of a kernel: what its metadata key is,
// how its value reads, its default ("" when it has none, or when the
// default comes from a tensor's shape: Doc says so), the values an enum
// allows and what it means.
type ParamSpec struct {
	Name    string
	Kind    ParamKind
	Default string
	Allowed []string
	Doc     string
}

// OutDType is the dtype output name is to be rounded to: out's entry when
// it names one (an error naming the tensor when the contract does not
// allow it), else def.
func OutDType(out OutDTypes, name string, def tensor.DType, allowed ...tensor.DType) (tensor.DType, error) {
	d, ok := out[name]
	if !ok || d == "" {
		return def, nil
	}
	return d, CheckDType(name, &tensor.Tensor{DType: d}, allowed...)
}
