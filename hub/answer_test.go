package hub

import (
	"testing"

	"github.com/natsmesh/natsmesh/subjects"
)

func TestAnswerTokens(t *testing.T) {
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

func TestAnswerSubjectRule(t *testing.T) {
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
