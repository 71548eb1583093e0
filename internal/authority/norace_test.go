//go:build !race

package authority

// raceDetector says the tests run under the race detector (race_test.go).
const raceDetector = false
