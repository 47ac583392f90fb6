package sim

// The tests look kernels up by name: every family registers itself.
import _ "github.com/kcheck-dev/kcheck/internal/kernels/all"
