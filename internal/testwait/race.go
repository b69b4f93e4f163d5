//go:build race

package testwait

// raceScale is how much slower code runs under the race detector (5-10x,
// more for a guest's compile), rounded up.
const raceScale = 3
