package hub

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
)

// Answer binding (DESIGN §5: a sender takes an answer only from the node
// generation that accepted that delivery). Each host — one node generation
// — draws a random answer key. Its Accepted replies carry the key
// (HeaderAnswerKey), and they go to the sender's inbox, which with the
// permission profiles only nodes can read; every late verdict and response
// carries AnswerTokenOf(key, delivery ID) (HeaderAnswerToken). A sender keeps
// the key of each generation that accepted its deliveries and drops an
// answer whose token does not match: someone who saw the delivery, or
// another generation, cannot answer in the accepting generation's name.
const (
	// HeaderAnswerKey, in an Accepted reply, is the accepting generation's
	// answer key: 32 lowercase hex digits.
	HeaderAnswerKey = "Mesh-Answer-Key"
	// HeaderAnswerToken, in a late verdict or response, is
	// AnswerTokenOf(key, delivery ID).
	HeaderAnswerToken = "Mesh-Answer-Token"
)

// newAnswerKey returns 128 random bits as hex.
func newAnswerKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// AnswerTokenOf returns the token of an answer to delivery id under an answer
// key: the first 128 bits of HMAC-SHA256(key, id), as 32 lowercase hex
// digits. Pure; safe for concurrent use.
func AnswerTokenOf(key, id string) string {
	var tok [2 * answerMACLen]byte
	answerToken(key, id, &tok)
	return string(tok[:])
}

// ValidAnswerToken reports whether token is AnswerTokenOf(key, id), in
// constant time. An empty key never validates.
func ValidAnswerToken(key, id, token string) bool {
	if key == "" {
		return false
	}
	var tok [2 * answerMACLen]byte
	answerToken(key, id, &tok)
	if len(token) != len(tok) {
		return false
	}
	var diff byte
	for i := range tok { // constant time, as hmac.Equal, without copying token
		diff |= tok[i] ^ token[i]
	}
	return diff == 0
}

const answerMACLen = 16

// answerToken writes AnswerTokenOf(key, id) to tok. It computes the HMAC
// from its definition, H((K^opad) || H((K^ipad) || id)), on stack buffers
// — no allocation, where crypto/hmac allocates its two hashes per call —
// for keys of at most one block (answer keys are 32 bytes) and IDs of at
// most MaxIDLen bytes; anything longer goes through crypto/hmac.
func answerToken(key, id string, tok *[2 * answerMACLen]byte) {
	var mac [sha256.Size]byte
	if len(key) > sha256.BlockSize || len(id) > MaxIDLen {
		m := hmac.New(sha256.New, []byte(key))
		m.Write([]byte(id))
		copy(mac[:], m.Sum(nil))
	} else {
		var in [sha256.BlockSize + MaxIDLen]byte
		var out [sha256.BlockSize + sha256.Size]byte
		for i := 0; i < sha256.BlockSize; i++ {
			var k byte
			if i < len(key) {
				k = key[i]
			}
			in[i], out[i] = k^0x36, k^0x5c
		}
		n := copy(in[sha256.BlockSize:], id)
		inner := sha256.Sum256(in[:sha256.BlockSize+n])
		copy(out[sha256.BlockSize:], inner[:])
		mac = sha256.Sum256(out[:])
	}
	hex.Encode(tok[:], mac[:answerMACLen])
}
