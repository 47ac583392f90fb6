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
// way), or else the one candidate whose words hold name's words in order,
// each word within a typo ("page_of_by_one" for "page_boundary_off_by_one":
// a word left out is a bigger slip than an edit distance forgives, but
// the words a user remembers still say which name they meant). Ties of
// the edit distance go to the first candidate; ties of the other two
// rules give no guess.
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
	return byWords(n, candidates)
}

// byWords is the candidate whose words hold all of name's words, in order,
// each within a third of its length in edits (a word of one character must
// match exactly), with the fewest words left over; "" when name has fewer
// than two words or two candidates tie.
func byWords(name string, candidates []string) string {
	want := words(name)
	if len(want) < 2 {
		return ""
	}
	best, bestExtra, tie := "", -1, false
	for _, c := range candidates {
		have := words(strings.ToLower(c))
		if !holdsInOrder(have, want) {
			continue
		}
		switch extra := len(have) - len(want); {
		case bestExtra < 0 || extra < bestExtra:
			best, bestExtra, tie = c, extra, false
		case extra == bestExtra:
			tie = true
		}
	}
	if tie {
		return ""
	}
	return best
}

// words splits a name at everything that is not a letter or a digit
// ("splitk_combine/deepseek-v3/tp8/s2": splitk, combine, deepseek, v3,
// tp8, s2).
func words(name string) []string {
	return strings.FieldsFunc(name, func(r rune) bool {
		return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9')
	})
}

// holdsInOrder says whether want's words match a subsequence of have's.
func holdsInOrder(have, want []string) bool {
	i := 0
	for _, h := range have {
		if i < len(want) && nearWord(want[i], h) {
			i++
		}
	}
	return i == len(want)
}

func nearWord(w, h string) bool {
	if len([]rune(w)) < 2 {
		return w == h
	}
	return distance(w, h) <= max(1, len([]rune(w))/3)
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
