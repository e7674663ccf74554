// Package raceexit spares a test binary built with -race the race
// detector's pause at exit.
//
// A program built with -race that exits with status 0 first sleeps
// atexit_sleep_ms (a GORACE option, 1000 by default) whenever other
// goroutines exist — in a Go program always, the runtime's own count — so
// that a race another goroutine is still reporting gets printed. go test
// -race ./... runs one test binary a package, each holding one of go test's
// -p slots (two on a 2-core machine) while it runs: the pause kept every
// package a second longer than its tests, about 25 slot-seconds of the
// README's command, and every meshd, testnode and nats-server an
// integration test stops cleanly paused a second more before its test
// could go on.
//
// [Exec], called first in each package's TestMain, re-executes the test
// binary with atexit_sleep_ms=0 added to GORACE; the programs the tests
// start inherit it. Races are still detected and reported when they
// happen, a test during which one is reported still fails, and a binary
// that reported one still exits with status 66: only a report being
// written by another goroutine at the instant of exit could be cut short.
// A GORACE that names atexit_sleep_ms itself is left as it is.
package raceexit

import (
	"os"
	"strings"
)

// option is the GORACE option Exec adds.
const option = "atexit_sleep_ms=0"

// Exec re-executes the running test binary with atexit_sleep_ms=0 added
// to GORACE, when it was built with -race (on a Unix system), GORACE does
// not name atexit_sleep_ms already, and the binary can be found; otherwise,
// and if the exec fails, it returns and the tests run in this process, as
// they would without it. Call it first in TestMain, before anything with an
// effect outside the process (a temporary directory, a server).
func Exec() {
	if env, ok := environ(os.Getenv("GORACE")); ok && enabled {
		execSelf(env)
	}
}

// environ returns the value of GORACE Exec sets given the current one, and
// false when the current one names atexit_sleep_ms (the caller chose).
func environ(gorace string) (string, bool) {
	for _, opt := range strings.FieldsFunc(gorace, separator) {
		if name, _, _ := strings.Cut(opt, "="); name == "atexit_sleep_ms" {
			return gorace, false
		}
	}
	if gorace == "" {
		return option, true
	}
	return gorace + " " + option, true
}

// separator reports whether c separates GORACE's options, as the race
// runtime's flag parser has it.
func separator(c rune) bool {
	return c == ' ' || c == ',' || c == ':' || c == '\n' || c == '\t' || c == '\r'
}
