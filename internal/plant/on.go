//go:build natsmesh_plant

package plant

import (
	"os"
	"strings"
)

// On reports whether bug b is planted: named in NATSMESH_PLANT, read at
// each call (a test process that plants a bug in itself sets the variable
// for one subtest only).
func On(b Bug) bool {
	for p := range strings.SplitSeq(os.Getenv(EnvVar), ",") {
		if Bug(strings.TrimSpace(p)) == b {
			return true
		}
	}
	return false
}

// Built reports whether this binary was built with the natsmesh_plant tag.
const Built = true
