//go:build unix

package natstest

import (
	"syscall"
	"time"
)

// ProcessCPU returns the CPU time (user + system) this process has used so
// far, or 0 where it cannot be read: benchmarks report CPU per operation
// with it, which a machine shared with other work changes far less than a
// rate. Safe for concurrent use.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
