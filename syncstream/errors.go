package syncstream

import "errors"

// ErrMalformedFrames is wrapped by DecodeFrames's errors: the payload is not
// a valid frames encoding.
var ErrMalformedFrames = errors.New("syncstream: malformed frames")
