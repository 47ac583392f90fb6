package backend_test

// The tests look kernels up by name: every family registers itself. The
// families reach this package (through their faults, which register the
// faulty backend), so the tests are an external test package.
import _ "github.com/kcheck-dev/kcheck/internal/kernels/all"
