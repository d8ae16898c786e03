//go:build race

package snapfile

// raceDetector tells tests that the race detector is on: SQLite, compiled
// to Go, runs some ten times slower under it, so the model test runs fewer
// seeds there (its point is the buffered store's answers; the code it
// drives starts no goroutines). `make test` runs every seed without the
// race detector as well.
const raceDetector = true
