//go:build !race

package docs

const raceEnabled = false
