package mesh

import "errors"

var (
	// ErrInvalidConfig: a required Config field is missing or invalid, or
	// an option's value is out of range.
	ErrInvalidConfig = errors.New("mesh: invalid config")
)
