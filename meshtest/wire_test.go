package meshtest

import "testing"

// TestEncodeTokenExamples pins the suite's own encoder to the worked
// examples of protocol.md §2.5.
func TestEncodeTokenExamples(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"echo/x", "echo/x"},
		{"", "="},
		{"echo/a.b", "echo/a=2Eb"},
		{"room/42 lobby", "room/42=20lobby"},
		{"kv/é", "kv/=C3=A9"},
		{"x/*", "x/=2A"},
		{"s.1", "s=2E1"},
		{"a=b/c~d", "a=3Db/c=7Ed"},
		{"x>y", "x=3Ey"},
	} {
		if got := encodeToken(c.in); got != c.want {
			t.Errorf("encodeToken(%q) = %q, protocol.md §2.5 says %q", c.in, got, c.want)
		}
	}
	if got := ingressSubject(DefaultPrefix, "a=b/c~d", "x>y"); got != "mesh.v1.in.a=3Db/c=7Ed.x=3Ey" {
		t.Errorf("ingress subject %q", got)
	}
}

// TestValidPrefix applies §2.1.
func TestValidPrefix(t *testing.T) {
	t.Parallel()
	for p, ok := range map[string]bool{"mesh.v1": true, "a": true, "acme-1.mesh_2.v1": true, "": false, "a..b": false, "a.": false, "a.*": false, "a.>": false, "a b": false} {
		if err := validPrefix(p); (err == nil) != ok {
			t.Errorf("validPrefix(%q) = %v", p, err)
		}
	}
}
