//go:build race

package authority

// raceDetector says the tests run under the race detector, whose
// instrumentation makes every call several times slower: timings measured
// so say nothing of a real build.
const raceDetector = true
