//go:build !unix

package mesh

import "time"

// processCPU is not measured here.
func processCPU() time.Duration { return 0 }
