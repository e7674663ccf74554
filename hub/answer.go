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
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(id))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// ValidAnswerToken reports whether token is AnswerTokenOf(key, id), in
// constant time. An empty key never validates.
func ValidAnswerToken(key, id, token string) bool {
	return key != "" && hmac.Equal([]byte(AnswerTokenOf(key, id)), []byte(token))
}
