//go:build race

package localstore

// raceDetector tells tests that the race detector is on: SQLite, compiled
// to Go, runs some ten times slower under it, so the bit-flip test reads
// a smaller store for fewer seeds (its point is the checks, not races).
const raceDetector = true
