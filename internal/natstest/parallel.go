package natstest

import (
	"flag"
	"strconv"
)

// RaiseParallel sets go test's -parallel to n unless the command line set
// it; call it from TestMain before m.Run. The tests of a package that call
// t.Parallel spend their time waiting on timers, heartbeats and servers
// far more than computing: at the default (GOMAXPROCS, 2 on the machine
// the README's timing is for) their waits would hold one of go test's -p
// slots about n/2 times as long. The long suite (Long) runs them one at a
// time instead, as before: the shapes it scales up assume the machine.
// Tests that call t.Setenv, count allocations or the process's goroutines,
// or assert how long something took must not call t.Parallel (go test
// runs those alone, before the parallel ones).
func RaiseParallel(n int) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if Long() {
			n = 1
		}
		if err := flag.Set("test.parallel", strconv.Itoa(n)); err != nil {
			panic(err)
		}
	}
}
