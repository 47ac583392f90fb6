//go:build race

package conformance

// raceEnabled: under the race detector Cases judges one case of each
// kernel and cache dtype (the references run about fifteen times slower).
const raceEnabled = true
