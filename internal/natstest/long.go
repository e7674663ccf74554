package natstest

import "os"

// Long reports whether the long suite runs (NATSMESH_LONG=1, which .ci/run
// sets for its long step): the README's quick suite, go test -race ./...,
// must fit five minutes on a cold 2-core machine, so the tests that scale a
// property up (deeper lanes, more streams, more repetitions) run a smaller
// shape of it unless Long. The variable is read when a test asks, not in a
// package initializer, so that go test's cache records it.
func Long() bool { return os.Getenv("NATSMESH_LONG") == "1" }
