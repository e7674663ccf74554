//go:build !race

package mesh

// raceEnabled: see race_on_test.go.
const raceEnabled = false
