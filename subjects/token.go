package subjects

import (
	"fmt"
	"strings"
)

// Token encoding (DESIGN §2). An address or a stream becomes one subject
// token:
//
//   - the bytes A-Z a-z 0-9 - _ / are kept verbatim;
//   - every other byte is written =HH, two uppercase hex digits (so "=" itself
//     is "=3D", "." is "=2E", a space is "=20", and each byte of a multi-byte
//     UTF-8 rune is escaped on its own);
//   - the empty string is a lone "=".
//
// The result is printable ASCII, never empty, and has no ".", "*", ">",
// whitespace or control character, so it is always one literal NATS subject
// token and never a wildcard. Its alphabet [-/_=A-Za-z0-9] is inside the
// JetStream KV key alphabet [-/_=.a-zA-Z0-9], so a token is also a KV key.
// Decoding accepts only this canonical form (uppercase hex, no escaped
// verbatim byte, "=" alone only for the empty string), so EncodeToken and
// DecodeToken are inverse bijections between byte strings and valid tokens.

const upperHex = "0123456789ABCDEF"

// emptyToken stands for the empty string.
const emptyToken = "="

func isVerbatim(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '/'
}

// EncodeToken returns the subject token for s (any bytes). It never fails.
func EncodeToken(s string) string {
	if s == "" {
		return emptyToken
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if !isVerbatim(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	appendToken(&b, s)
	return b.String()
}

// appendToken writes the encoding of a non-empty s to b.
func appendToken(b *strings.Builder, s string) {
	if s == "" {
		b.WriteString(emptyToken)
		return
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isVerbatim(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('=')
		b.WriteByte(upperHex[c>>4])
		b.WriteByte(upperHex[c&0x0F])
	}
}

// encodedLen is len(EncodeToken(s)).
func encodedLen(s string) int {
	if s == "" {
		return 1
	}
	n := len(s)
	for i := 0; i < len(s); i++ {
		if !isVerbatim(s[i]) {
			n += 2
		}
	}
	return n
}

// DecodeToken returns the string t encodes. It accepts only the canonical
// form [EncodeToken] produces; anything else is an error matching
// [ErrInvalidToken].
func DecodeToken(t string) (string, error) {
	if t == emptyToken {
		return "", nil
	}
	if t == "" {
		return "", fmt.Errorf("%w: empty token", ErrInvalidToken)
	}
	if strings.IndexByte(t, '=') < 0 {
		for i := 0; i < len(t); i++ {
			if !isVerbatim(t[i]) {
				return "", fmt.Errorf("%w: byte %q at %d of %q", ErrInvalidToken, t[i], i, t)
			}
		}
		return t, nil
	}
	out := make([]byte, 0, len(t))
	for i := 0; i < len(t); i++ {
		c := t[i]
		if isVerbatim(c) {
			out = append(out, c)
			continue
		}
		if c != '=' || i+2 >= len(t) {
			return "", fmt.Errorf("%w: byte %q at %d of %q", ErrInvalidToken, c, i, t)
		}
		hi, ok1 := unhex(t[i+1])
		lo, ok2 := unhex(t[i+2])
		if !ok1 || !ok2 {
			return "", fmt.Errorf("%w: bad escape at %d of %q", ErrInvalidToken, i, t)
		}
		v := hi<<4 | lo
		if isVerbatim(v) {
			return "", fmt.Errorf("%w: escaped verbatim byte %q at %d of %q", ErrInvalidToken, v, i, t)
		}
		out = append(out, v)
		i += 2
	}
	return string(out), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
