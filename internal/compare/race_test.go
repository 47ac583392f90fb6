//go:build race

package compare

// raceEnabled: the race detector slows the references about fifteenfold,
// so the catalog-wide property test runs without it (make test runs it so).
const raceEnabled = true
