// Package kerneltest holds the checks every kernel family's tests share,
// as net/http/httptest does for handlers: what a family's own test would
// otherwise write out again.
package kerneltest

import (
	"context"
	"testing"

	"github.com/kcheck-dev/kcheck/internal/kernel"
)

// RefusedByValidate checks that kernel.Validate alone, with no reference
// run, refuses in with exactly want, and that Evaluate (Validate, then
// Reference) refuses it with the same bytes: the one validation is
// Validate's, and the reference adds none before it.
func RefusedByValidate(t testing.TB, kname, row string, in kernel.Inputs, want string) {
	t.Helper()
	k, err := kernel.Lookup(kname)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kernel.Validate(k, in); err == nil || err.Error() != want {
		t.Errorf("%s, %s: Validate: %v, want %q", kname, row, err, want)
	}
	if _, err := kernel.Evaluate(context.Background(), k, in, kernel.DefaultPrecision(), nil); err == nil || err.Error() != want {
		t.Errorf("%s, %s: Evaluate: %v, want Validate's %q", kname, row, err, want)
	}
}
