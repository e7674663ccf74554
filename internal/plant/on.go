//go:build natsmesh_plant

package plant

import (
	"os"
	"strings"
)

var planted = func() map[Bug]bool {
	m := map[Bug]bool{}
	for b := range strings.SplitSeq(os.Getenv(EnvVar), ",") {
		if b = strings.TrimSpace(b); b != "" {
			m[Bug(b)] = true
		}
	}
	return m
}()

// On reports whether bug b is planted: named in NATSMESH_PLANT.
func On(b Bug) bool { return planted[b] }

// Built reports whether this binary was built with the natsmesh_plant tag.
const Built = true
