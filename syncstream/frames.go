package syncstream

import (
	"encoding/binary"
	"fmt"
)

// The frames encoding (docs/protocol.md §8a): the payload of a
// natsmesh.frames delivery is one format byte, 1, followed by one or more
// records, each
//
//	flags    1 byte: bit 0 snapshot, bit 1 closed (other bits 0; not both)
//	epoch    unsigned varint (LEB128, as Go's binary.AppendUvarint)
//	version  unsigned varint
//	attempt  unsigned varint length, then that many bytes (0: none)
//	data     unsigned varint length, then that many bytes
//
// A subscriber applies the records of one delivery in order, each through
// its (epoch, version) guard; a payload that does not decode is refused as a
// whole (nothing of it is applied).
const (
	// FramesFormat is the format byte this package writes and reads.
	FramesFormat = 1
	// MaxAttemptLen bounds a record's attempt.
	MaxAttemptLen = 256

	flagSnapshot = 1 << 0
	flagClosed   = 1 << 1
)

// AppendFrames appends the frames encoding of fs to b: the format byte when b
// is empty, then one record per frame. Appending records to an encoding
// (non-empty b) extends it.
func AppendFrames(b []byte, fs ...Frame) []byte {
	if len(b) == 0 {
		b = append(b, FramesFormat)
	}
	for i := range fs {
		b = appendRecord(b, &fs[i])
	}
	return b
}

func appendRecord(b []byte, f *Frame) []byte {
	var flags byte
	if f.Snapshot {
		flags |= flagSnapshot
	}
	if f.Closed {
		flags |= flagClosed
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, f.Epoch)
	b = binary.AppendUvarint(b, f.Version)
	b = binary.AppendUvarint(b, uint64(len(f.Attempt)))
	b = append(b, f.Attempt...)
	b = binary.AppendUvarint(b, uint64(len(f.Data)))
	return append(b, f.Data...)
}

// recordSize is the most bytes appendRecord adds for f.
func recordSize(f *Frame) int {
	return 1 + 3*binary.MaxVarintLen64 + len(f.Attempt) + binary.MaxVarintLen64 + len(f.Data)
}

// DecodeFrames decodes a frames encoding (see AppendFrames) into its frames,
// in order. A frame's Data aliases p (capacity capped at its length, so an
// append to it copies). Errors wrap ErrMalformedFrames: an empty payload, an
// unknown format byte, no record, a truncated or overlong field, unknown
// flag bits, snapshot and closed together, an attempt over MaxAttemptLen.
func DecodeFrames(p []byte) ([]Frame, error) {
	n, err := checkFrames(p)
	if err != nil {
		return nil, err
	}
	fs := make([]Frame, n)
	r := newFrameReader(p)
	for i := range fs {
		r.next(&fs[i])
	}
	return fs, nil
}

// checkFrames validates a frames encoding and returns its frame count.
func checkFrames(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, fmt.Errorf("%w: empty", ErrMalformedFrames)
	}
	if p[0] != FramesFormat {
		return 0, fmt.Errorf("%w: format %d, want %d", ErrMalformedFrames, p[0], FramesFormat)
	}
	p = p[1:]
	if len(p) == 0 {
		return 0, fmt.Errorf("%w: no frame", ErrMalformedFrames)
	}
	n := 0
	for len(p) > 0 {
		var err error
		if _, p, err = decodeRecord(p, false); err != nil {
			return 0, fmt.Errorf("%w: frame %d: %v", ErrMalformedFrames, n, err)
		}
		n++
	}
	return n, nil
}

// frameReader reads the frames of an encoding checkFrames accepted.
type frameReader struct{ p []byte }

func newFrameReader(p []byte) frameReader { return frameReader{p: p[1:]} }

// next decodes the next frame into f; false: there is none.
func (r *frameReader) next(f *Frame) bool {
	if len(r.p) == 0 {
		return false
	}
	*f, r.p, _ = decodeRecord(r.p, true)
	return true
}

// decodeRecord decodes the record at the start of p and returns the rest;
// keep false only checks it (without allocating its attempt).
func decodeRecord(p []byte, keep bool) (Frame, []byte, error) {
	var f Frame
	flags := p[0]
	p = p[1:]
	if flags&^(flagSnapshot|flagClosed) != 0 {
		return f, nil, fmt.Errorf("unknown flags %#x", flags)
	}
	f.Snapshot, f.Closed = flags&flagSnapshot != 0, flags&flagClosed != 0
	if f.Snapshot && f.Closed {
		return f, nil, fmt.Errorf("snapshot and closed")
	}
	var ok bool
	if f.Epoch, p, ok = uvarint(p); !ok {
		return f, nil, fmt.Errorf("bad epoch")
	}
	if f.Version, p, ok = uvarint(p); !ok {
		return f, nil, fmt.Errorf("bad version")
	}
	var attempt, data []byte
	if attempt, p, ok = field(p); !ok || len(attempt) > MaxAttemptLen {
		return f, nil, fmt.Errorf("bad attempt")
	}
	if data, p, ok = field(p); !ok {
		return f, nil, fmt.Errorf("bad data")
	}
	if len(attempt) > 0 && keep {
		f.Attempt = string(attempt)
	}
	if len(data) > 0 {
		f.Data = data[:len(data):len(data)]
	}
	return f, p, nil
}

func uvarint(p []byte) (uint64, []byte, bool) {
	v, n := binary.Uvarint(p)
	if n <= 0 {
		return 0, nil, false
	}
	return v, p[n:], true
}

// field reads a length-prefixed field.
func field(p []byte) ([]byte, []byte, bool) {
	n, p, ok := uvarint(p)
	if !ok || n > uint64(len(p)) {
		return nil, nil, false
	}
	return p[:n], p[n:], true
}
