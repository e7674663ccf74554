package natstest

import (
	"flag"
	"strconv"
)

// RaiseParallel raises go test's -parallel to n unless the command line
// set it; call it from TestMain before m.Run. The tests
// that call t.Parallel in the packages that use it spend their time
// waiting on timers, heartbeats and servers, not computing: with the
// default (GOMAXPROCS, 2 on the machine the README's timing is for) they
// would wait one after another, holding one of go test's -p slots for the
// sum of their waits. Tests that call t.Setenv, or count the process's
// goroutines, must not call t.Parallel (go test runs them alone, before
// the parallel ones).
func RaiseParallel(n int) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", strconv.Itoa(n)); err != nil {
			panic(err)
		}
	}
}
