package hub

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"testing"

	"github.com/natsmesh/natsmesh/subjects"
)

func TestAnswerTokens(t *testing.T) {
	t.Parallel()
	k1, k2 := newAnswerKey(), newAnswerKey()
	if len(k1) != 32 || k1 == k2 {
		t.Fatalf("keys %q %q: want 32 hex digits, distinct", k1, k2)
	}
	tok := AnswerTokenOf(k1, "id-1")
	if len(tok) != 32 || tok != AnswerTokenOf(k1, "id-1") {
		t.Fatalf("token %q not deterministic 32 hex digits", tok)
	}
	for _, c := range []struct {
		key, id, token string
		ok             bool
	}{
		{k1, "id-1", tok, true},
		{k2, "id-1", tok, false},
		{k1, "id-2", tok, false},
		{k1, "id-1", "", false},
		{"", "id-1", AnswerTokenOf("", "id-1"), false},
	} {
		if got := ValidAnswerToken(c.key, c.id, c.token); got != c.ok {
			t.Errorf("ValidAnswerToken(%q, %q, %q) = %v", c.key, c.id, c.token, got)
		}
	}
}

// TestAnswerTokenIsHMAC pins the allocation-free HMAC against crypto/hmac,
// across key and ID lengths on both sides of the block size and MaxIDLen.
func TestAnswerTokenIsHMAC(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for _, kl := range []int{0, 1, 31, 32, 63, 64, 65, 200} {
		for _, il := range []int{0, 1, 22, 127, 128, 129, 300} {
			for range 20 {
				key, id := make([]byte, kl), make([]byte, il)
				for i := range key {
					key[i] = byte(r.Uint32())
				}
				for i := range id {
					id[i] = byte(r.Uint32())
				}
				m := hmac.New(sha256.New, key)
				m.Write(id)
				want := hex.EncodeToString(m.Sum(nil)[:16])
				if got := AnswerTokenOf(string(key), string(id)); got != want {
					t.Fatalf("key %d bytes, id %d bytes: token %s, HMAC %s", kl, il, got, want)
				}
				if kl > 0 && !ValidAnswerToken(string(key), string(id), want) {
					t.Fatalf("key %d bytes, id %d bytes: HMAC token not valid", kl, il)
				}
			}
		}
	}
}

func TestAnswerSubjectRule(t *testing.T) {
	t.Parallel()
	h := &Host{ansPrefix: subjects.DefaultPrefix.Sub(AnswerToken + ".")}
	for s, ok := range map[string]bool{
		"mesh.v1.ans.a.1":          true,
		"mesh.v1.ans.x":            true,
		"mesh.v1.ans.a*b.1":        true,
		"mesh.v1.ans.":             false,
		"mesh.v1.ans":              false,
		"mesh.v1.ans.*":            false,
		"mesh.v1.ans.a.>":          false,
		"mesh.v1.ans.a..1":         false,
		"mesh.v1.ans.a b":          false,
		"mesh.v1.ans.a\x7f":        false,
		"mesh.v1.ctl.a.drain":      false,
		"$KV.b.k":                  false,
		"mesh.v1.answers.a.1":      false,
		"other.mesh.v1.ans.a.1":    false,
		"mesh.v1.ans." + long(600): false,
	} {
		if got := h.answerSubject(s); got != ok {
			t.Errorf("answerSubject(%q) = %v, want %v", s, got, ok)
		}
	}
}

func long(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a'
	}
	return string(b)
}

// BenchmarkAnswerToken is the binding's cost per answer: one HMAC-SHA256 of
// a delivery ID (the hub signs, the sender verifies).
func BenchmarkAnswerToken(b *testing.B) {
	key, id := newAnswerKey(), "LjJVqvYAhUiULbJz0kAEst"
	tok := AnswerTokenOf(key, id)
	b.ReportAllocs()
	for b.Loop() {
		if !ValidAnswerToken(key, id, tok) {
			b.Fatal("invalid")
		}
	}
}
