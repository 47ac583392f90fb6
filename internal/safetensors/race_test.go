//go:build race

package safetensors

// raceEnabled: the race detector's shadow memory counts in a child's RSS.
const raceEnabled = true
