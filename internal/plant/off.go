//go:build !natsmesh_plant

package plant

// On reports whether bug b is planted: never, in a build without the
// natsmesh_plant tag.
func On(Bug) bool { return false }

// Built reports whether this binary was built with the natsmesh_plant tag.
const Built = false
