package cases_test

// The tests look kernels up by name: every family registers itself. The
// families import this package (their faults' triggers are cases), so the
// tests that need them are an external test package.
import _ "github.com/kcheck-dev/kcheck/internal/kernels/all"
