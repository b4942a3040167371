// Package layering holds the test of the package layout in
// docs/design.md §8: nothing in the product imports test support or
// benchmarks, and a product package imports only packages of a lower
// layer. The package has no code; its test reads the import graph with
// `go list` and fails with the offending import.
package layering
