// Package docs holds the tests that keep the repository's documents true:
// every example a help text or the README shows runs as shown (or is
// skipped for a stated reason), the Makefile has the targets the README
// names, and every citation of the contract reference
// (reference/CONTRACTS.md §N) names a section that exists. It has no code
// of its own: a document that drifts from the code fails `make test`.
package docs
