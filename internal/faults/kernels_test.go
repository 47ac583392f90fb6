package faults_test

// The tests look kernels and faults up by name: every family registers
// both, and this is the catalog's one list of families.
import _ "github.com/kcheck-dev/kcheck/internal/kernels/all"
