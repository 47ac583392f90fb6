// Package suggest finds the name a user probably meant when they mistyped
// one (a case, kernel, fault, backend, preset or engine), so that an
// "unknown" error can say "did you mean ...?" instead of leaving them to
// read a list of hundreds.
package suggest

import (
	"fmt"
	"strings"
)

// Closest returns the candidate nearest to name, or "" when none is near
// enough to be what was meant: an edit distance (insertions, deletions,
// substitutions and swaps of neighbours, case ignored) of at most a third
// of name's length, and at least 1, or else the one candidate that holds
// name whole or is held whole by it ("mla" for "mla_decode" is too short
// to hold a guess: names of fewer than 3 characters are not matched that
// way). Ties go to the first candidate.
func Closest(name string, candidates []string) string {
	n := strings.ToLower(name)
	best, bestD := "", -1
	limit := max(1, len([]rune(n))/3)
	for _, c := range candidates {
		d := distance(n, strings.ToLower(c))
		if d <= limit && (bestD < 0 || d < bestD) {
			best, bestD = c, d
		}
	}
	if best != "" || len(n) < 3 {
		return best
	}
	var holding []string
	for _, c := range candidates {
		lc := strings.ToLower(c)
		if strings.Contains(lc, n) || strings.Contains(n, lc) {
			holding = append(holding, c)
		}
	}
	if len(holding) == 1 {
		return holding[0]
	}
	return ""
}

// DidYouMean is `; did you mean "x"?` for the closest candidate, or "".
func DidYouMean(name string, candidates []string) string {
	if c := Closest(name, candidates); c != "" && c != name {
		return fmt.Sprintf("; did you mean %q?", c)
	}
	return ""
}

// distance is the optimal string alignment distance between a and b (the
// Levenshtein distance with swaps of adjacent characters counted as one
// edit, the commonest typo).
func distance(a, b string) int {
	x, y := []rune(a), []rune(b)
	prev2 := make([]int, len(y)+1)
	prev := make([]int, len(y)+1)
	cur := make([]int, len(y)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(x); i++ {
		cur[0] = i
		for j := 1; j <= len(y); j++ {
			cost := 1
			if x[i-1] == y[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && x[i-1] == y[j-2] && x[i-2] == y[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(y)]
}
