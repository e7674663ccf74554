//go:build !race

package integration

// raceBuild reports whether this binary runs with the race detector.
const raceBuild = false
