//go:build !unix

package directory

import "time"

// processCPU is not measured here.
func processCPU() time.Duration { return 0 }
