//go:build !race

package snapfile

// raceDetector tells tests that the race detector is on (see
// race_on_test.go).
const raceDetector = false
