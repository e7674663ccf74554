package subjects

import (
	"errors"
	"strings"
	"testing"
)

// awkward are addresses that stress the encoding: dots, tildes, "=", spaces,
// lone wildcards, empty-looking tokens, runs of "/", Unicode, the length limit.
var awkward = []string{
	"echo/x",
	"echo/a.b",
	"echo/..",
	"echo/.",
	"echo/~user",
	"echo/=",
	"echo/=3D",
	"echo/a=b",
	"echo/ ",
	"echo/a b",
	"echo/*",
	"echo/>",
	"echo/a.*",
	"echo/a.>",
	"echo/*.>",
	"echo//",
	"echo///",
	"echo/a//b",
	"echo/ünïcødé",
	"echo/日本語",
	"echo/🙂",
	"kind.with.dots/id",
	"*/>",
	">/*",
	"=/=",
	"echo/" + strings.Repeat("x", MaxAddressLen-5),
	"echo/" + strings.Repeat(".", MaxAddressLen-5),
	"echo/" + strings.Repeat("é", (MaxAddressLen-5)/2),
}

func TestAddressValidate(t *testing.T) {
	tests := []struct {
		addr string
		want error
	}{
		{"echo/x", nil},
		{"echo/a/b/c", nil},
		{"echo/ spaces and . dots ~", nil},
		{"echo/" + strings.Repeat("x", MaxAddressLen-5), nil},
		{"", ErrEmptyAddress},
		{"echo/" + strings.Repeat("x", MaxAddressLen-4), ErrAddressTooLong},
		{"echo/\xff", ErrInvalidUTF8},
		{"echo/a\x00b", ErrControlChar},
		{"echo/a\nb", ErrControlChar},
		{"echo/a\x7fb", ErrControlChar},
		{"echo/a\u0085b", ErrControlChar},
		{"noslash", ErrMissingKind},
		{"/id", ErrMissingKind},
		{"echo/", ErrMissingID},
	}
	for _, tt := range tests {
		_, err := ParseAddress(tt.addr)
		if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
			t.Errorf("ParseAddress(%q) = %v, want %v", tt.addr, err, tt.want)
		}
	}
	for _, a := range awkward {
		if err := Address(a).Validate(); err != nil {
			t.Errorf("awkward address %q rejected: %v", a, err)
		}
	}
	if k, id := Address("a.b/c/d").Kind(), Address("a.b/c/d").ID(); k != "a.b" || id != "c/d" {
		t.Errorf("Kind/ID = %q/%q", k, id)
	}
}

func TestStreamValidate(t *testing.T) {
	for _, s := range []string{"", "s", "a.b", " ", strings.Repeat("é", MaxStreamLen/2)} {
		if err := Stream(s).Validate(); err != nil {
			t.Errorf("Stream(%q): %v", s, err)
		}
	}
	if err := Stream(strings.Repeat("x", MaxStreamLen+1)).Validate(); !errors.Is(err, ErrStreamTooLong) {
		t.Errorf("long stream: %v", err)
	}
	if err := Stream("\xc3").Validate(); !errors.Is(err, ErrInvalidUTF8) {
		t.Errorf("bad utf8 stream: %v", err)
	}
}

func TestNodeID(t *testing.T) {
	good := []NodeID{{"a", 1}, {"node-1_B", 18446744073709551615}, {strings.Repeat("n", 64), 7}}
	for _, n := range good {
		if err := n.Validate(); err != nil {
			t.Errorf("%v: %v", n, err)
		}
		back, err := ParseNodeID(n.String())
		if err != nil || back != n {
			t.Errorf("ParseNodeID(%q) = %v, %v", n.String(), back, err)
		}
	}
	bad := []struct {
		n    NodeID
		want error
	}{
		{NodeID{"", 1}, ErrInvalidNodeName},
		{NodeID{"a.b", 1}, ErrInvalidNodeName},
		{NodeID{"a b", 1}, ErrInvalidNodeName},
		{NodeID{"*", 1}, ErrInvalidNodeName},
		{NodeID{strings.Repeat("n", 65), 1}, ErrInvalidNodeName},
		{NodeID{"a", 0}, ErrInvalidGeneration},
	}
	for _, tt := range bad {
		if err := tt.n.Validate(); !errors.Is(err, tt.want) {
			t.Errorf("%#v: %v, want %v", tt.n, err, tt.want)
		}
	}
	for _, s := range []string{"a", "a.", "a.0", "a.01", "a.+1", "a.1.2", ".1", "a.-1"} {
		if _, err := ParseNodeID(s); err == nil {
			t.Errorf("ParseNodeID(%q) accepted", s)
		}
	}
}

func TestTokenEncoding(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "="},
		{"echo/x", "echo/x"},
		{"A-z_0/9", "A-z_0/9"},
		{"a.b", "a=2Eb"},
		{"=", "=3D"},
		{"~", "=7E"},
		{" ", "=20"},
		{"*", "=2A"},
		{">", "=3E"},
		{"..", "=2E=2E"},
		{"é", "=C3=A9"},
		{"\x00", "=00"},
	}
	for _, tt := range tests {
		if got := EncodeToken(tt.in); got != tt.want {
			t.Errorf("EncodeToken(%q) = %q, want %q", tt.in, got, tt.want)
		}
		back, err := DecodeToken(tt.want)
		if err != nil || back != tt.in {
			t.Errorf("DecodeToken(%q) = %q, %v", tt.want, back, err)
		}
	}
	// Non-canonical or foreign tokens are refused, so decoding is injective.
	for _, bad := range []string{"", "a.b", "=2e", "=41", "=2", "=", "==", "=3", "a=", "a b", "*", ">", "=ZZ", "a~"} {
		if bad == "=" {
			continue // the empty string's token
		}
		if _, err := DecodeToken(bad); !errors.Is(err, ErrInvalidToken) {
			t.Errorf("DecodeToken(%q) = %v, want ErrInvalidToken", bad, err)
		}
	}
}

func TestSubjectsRoundTrip(t *testing.T) {
	p := DefaultPrefix
	node := NodeID{"node-1", 42}
	streams := []string{"", "s", "a.b", "=", " ", "*", ">", "日本"}
	for _, a := range awkward {
		for _, s := range streams {
			subj := p.Delivery(node, Address(a), Stream(s))
			if !strings.HasPrefix(subj, "mesh.v1.dlv.node-1.42.") {
				t.Fatalf("delivery subject %q", subj)
			}
			if n := strings.Count(subj, "."); n != 6 {
				t.Fatalf("delivery subject %q has %d dots", subj, n)
			}
			d, err := p.ParseDelivery(subj)
			if err != nil || d.Node != node || d.Addr != Address(a) || d.Stream != Stream(s) {
				t.Fatalf("ParseDelivery(%q) = %+v, %v", subj, d, err)
			}
			in := p.Ingress(Address(a), Stream(s))
			ga, gs, err := p.ParseIngress(in)
			if err != nil || ga != Address(a) || gs != Stream(s) {
				t.Fatalf("ParseIngress(%q) = %q %q %v", in, ga, gs, err)
			}
		}
	}
	if got := p.NodeSubscription(node); got != "mesh.v1.dlv.node-1.42.>" {
		t.Errorf("NodeSubscription = %q", got)
	}
	if got := p.IngressSubscription(); got != "mesh.v1.in.*.*" {
		t.Errorf("IngressSubscription = %q", got)
	}
}

func TestParseRejects(t *testing.T) {
	p := DefaultPrefix
	bad := []string{
		"",
		"mesh.v1",
		"mesh.v2.dlv.n.1.echo/x.=",
		"mesh.v1.dlv.n.1.echo/x",
		"mesh.v1.dlv.n.1.echo/x.=.extra",
		"mesh.v1.dlv.n.0.echo/x.=",
		"mesh.v1.dlv.n.01.echo/x.=",
		"mesh.v1.dlv.n~.1.echo/x.=",
		"mesh.v1.dlv.n.1.echo.=",   // no kind
		"mesh.v1.dlv.n.1.=.=",      // empty address
		"mesh.v1.dlv.n.1.echo/x.*", // wildcard token
		"mesh.v1.dlv.n.1.echo/=2e.=",
		"mesh.v1.dlv.n.1.echo/=C3.=", // invalid UTF-8 in the address
		"mesh.v1.dlv.n.1.echo/=0A.=", // control character
		"mesh.v1.in.echo/x",
		"mesh.v1.in.echo/x.=.=",
		"mesh.v1x.dlv.n.1.echo/x.=",
	}
	for _, s := range bad {
		if d, err := p.ParseDelivery(s); err == nil {
			t.Errorf("ParseDelivery(%q) accepted: %+v", s, d)
		}
	}
	for _, s := range []string{"mesh.v1.in.echo/x", "mesh.v1.in.echo/x.=.=", "mesh.v1.in.=.=", "mesh.v1.dlv.echo/x.="} {
		if _, _, err := p.ParseIngress(s); err == nil {
			t.Errorf("ParseIngress(%q) accepted", s)
		}
	}
}

func TestPrefix(t *testing.T) {
	for _, s := range []string{"mesh.v1", "a", "a-b.c_d.E9"} {
		if _, err := ParsePrefix(s); err != nil {
			t.Errorf("ParsePrefix(%q): %v", s, err)
		}
	}
	for _, s := range []string{"", ".", "a.", ".a", "a..b", "a.*", "a.>", "a b", "$SYS", strings.Repeat("a", 129)} {
		if _, err := ParsePrefix(s); !errors.Is(err, ErrInvalidPrefix) {
			t.Errorf("ParsePrefix(%q) = %v", s, err)
		}
	}
	p := Prefix("acme.mesh")
	subj := p.Delivery(NodeID{"n", 1}, "echo/x", "")
	if subj != "acme.mesh.dlv.n.1.echo/x.=" {
		t.Errorf("custom prefix subject %q", subj)
	}
	if _, err := DefaultPrefix.ParseDelivery(subj); err == nil {
		t.Errorf("a subject of another prefix parsed")
	}
}

func TestNodeIDText(t *testing.T) {
	n := NodeID{"node-1", 42}
	b, err := n.MarshalText()
	if err != nil || string(b) != "node-1.42" {
		t.Fatalf("MarshalText = %q, %v", b, err)
	}
	var back NodeID
	if err := back.UnmarshalText(b); err != nil || back != n {
		t.Fatalf("UnmarshalText = %v, %v", back, err)
	}
	if err := back.UnmarshalText([]byte("bad name.1")); err == nil {
		t.Error("UnmarshalText accepted a bad name")
	}
	if err := back.UnmarshalText(nil); err != nil || !back.IsZero() {
		t.Error("empty text is not the zero NodeID")
	}
	if got := DefaultPrefix.Control("n1", "ping"); got != "mesh.v1.ctl.n1.ping" {
		t.Errorf("Control = %q", got)
	}
}

func TestSafeReply(t *testing.T) {
	p := DefaultPrefix
	for s, ok := range map[string]bool{
		"_INBOX.abc.def":          true,
		"_INBOX_mesh_v1.abc.1":    true,
		"reply.to.me":             true,
		"":                        false,
		"$KV.b.k":                 false,
		"$JS.API.STREAM.DELETE.x": false,
		"$SRV.PING":               false,
		"mesh.v1.ctl.a.drain":     false,
		"mesh.v1.ans.a.1":         false,
		"mesh.v1":                 true, // not under the prefix: a subject of its own
		"_INBOX.*":                false,
		"_INBOX.>":                false,
		"_INBOX..x":               false,
		"_INBOX.a b":              false,
	} {
		if got := p.SafeReply(s); got != ok {
			t.Errorf("SafeReply(%q) = %v, want %v", s, got, ok)
		}
	}
}
