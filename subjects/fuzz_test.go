package subjects

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/internal/natstest"
)

// kvBucket returns a JetStream KV bucket on an in-process server, used by
// every input of the fuzz target, so key validity is judged by nats.go's own
// check (KeyValue.Get refuses an invalid key with ErrInvalidKey before it
// sends anything) rather than by a copy of its pattern.
func kvBucket(f *testing.F) jetstream.KeyValue {
	s := natstest.RunServer(f)
	nc := natstest.Connect(f, s)
	js, err := jetstream.New(nc)
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "fuzz", Storage: jetstream.MemoryStorage})
	if err != nil {
		f.Fatal(err)
	}
	return kv
}

// checkKVKey fails unless tok is accepted as a KV key by nats.go and the server.
func checkKVKey(t *testing.T, kv jetstream.KeyValue, tok string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := kv.Get(ctx, tok)
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("token %q is not usable as a JetStream KV key: %v", tok, err)
	}
}

// checkToken fails unless tok is one literal NATS subject token.
func checkToken(t *testing.T, tok string) {
	if tok == "" || strings.ContainsAny(tok, ". \t\r\n") || !server.IsValidLiteralSubject(tok) || !server.IsValidPublishSubject("x."+tok+".y") {
		t.Fatalf("token %q is not a single literal subject token", tok)
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] < 0x21 || tok[i] > 0x7e {
			t.Fatalf("token %q has a non-printable byte at %d", tok, i)
		}
	}
}

func seedStrings() []string {
	s := append([]string{}, awkward...)
	return append(s, "", "=", "=3D", ".", "*", ">", " ", "\x00", "\xff", "a.b.c", "~~", "=2E")
}

// FuzzTokenRoundTrip: any bytes encode to one literal subject token that is
// also a KV key and decodes back byte for byte; any string that decodes
// re-encodes to itself (decoding accepts only the canonical form).
func FuzzTokenRoundTrip(f *testing.F) {
	for _, s := range seedStrings() {
		f.Add(s)
	}
	kv := kvBucket(f)
	f.Fuzz(func(t *testing.T, s string) {
		tok := EncodeToken(s)
		checkToken(t, tok)
		if len(s) <= max(MaxAddressLen, MaxStreamLen) {
			// Only addresses and streams become tokens; longer keys are
			// refused by the server's max control line, not by validity.
			checkKVKey(t, kv, tok)
		}
		back, err := DecodeToken(tok)
		if err != nil || back != s {
			t.Fatalf("DecodeToken(EncodeToken(%q)) = %q, %v", s, back, err)
		}
		if dec, err := DecodeToken(s); err == nil && EncodeToken(dec) != s {
			t.Fatalf("DecodeToken accepted non-canonical %q (re-encodes to %q)", s, EncodeToken(dec))
		}
	})
}

type tuple struct {
	node   NodeID
	addr   Address
	stream Stream
}

func (tu tuple) valid() bool {
	return tu.node.Validate() == nil && tu.addr.Validate() == nil && tu.stream.Validate() == nil
}

// FuzzDeliverySubject: two different (node, generation, address, stream)
// tuples never give the same subject; each subject parses back exactly; a
// node generation's subscription matches only its own deliveries, and the
// subscription for one address (any stream) never matches another address's
// subject — all judged by the server's own subject matching.
func FuzzDeliverySubject(f *testing.F) {
	ss := seedStrings()
	for i, a := range awkward {
		f.Add("n1", uint64(1), a, ss[i%len(ss)], "n1", uint64(1), awkward[(i+1)%len(awkward)], ss[(i+3)%len(ss)])
		f.Add("n1", uint64(1), a, "", "n1", uint64(2), a, "")
		f.Add("n-1", uint64(10), a, "s", "n-1", uint64(1), a, "s")
	}
	p := DefaultPrefix
	f.Fuzz(func(t *testing.T, n1 string, g1 uint64, a1, s1, n2 string, g2 uint64, a2, s2 string) {
		x := tuple{NodeID{n1, g1}, Address(a1), Stream(s1)}
		y := tuple{NodeID{n2, g2}, Address(a2), Stream(s2)}
		if !x.valid() || !y.valid() {
			return
		}
		sx := p.Delivery(x.node, x.addr, x.stream)
		sy := p.Delivery(y.node, y.addr, y.stream)
		for _, subj := range []string{sx, sy} {
			if !server.IsValidPublishSubject(subj) {
				t.Fatalf("subject %q is not a valid literal subject", subj)
			}
		}
		if (sx == sy) != (x == y) {
			t.Fatalf("tuples %+v and %+v give subjects %q and %q", x, y, sx, sy)
		}
		for _, c := range []struct {
			tu   tuple
			subj string
		}{{x, sx}, {y, sy}} {
			d, err := p.ParseDelivery(c.subj)
			if err != nil || d.Node != c.tu.node || d.Addr != c.tu.addr || d.Stream != c.tu.stream {
				t.Fatalf("ParseDelivery(%q) = %+v, %v; want %+v", c.subj, d, err, c.tu)
			}
		}
		// A node generation's one subscription.
		if got, want := server.SubjectMatchesFilter(sy, p.NodeSubscription(x.node)), x.node == y.node; got != want {
			t.Fatalf("subscription %q matches %q = %v, want %v", p.NodeSubscription(x.node), sy, got, want)
		}
		// A subscription to one destination, any stream.
		destFilter := strings.TrimSuffix(p.Delivery(x.node, x.addr, ""), "=") + "*"
		if got, want := server.SubjectMatchesFilter(sy, destFilter), x.node == y.node && x.addr == y.addr; got != want {
			t.Fatalf("filter %q matches %q = %v, want %v", destFilter, sy, got, want)
		}
		// An exact subject used as a subscription matches only itself.
		if server.SubjectMatchesFilter(sy, sx) != (x == y) {
			t.Fatalf("subscription %q matches %q", sx, sy)
		}
		// Ingress: same properties.
		ix, iy := p.Ingress(x.addr, x.stream), p.Ingress(y.addr, y.stream)
		same := x.addr == y.addr && x.stream == y.stream
		if (ix == iy) != same || server.SubjectMatchesFilter(iy, ix) != same {
			t.Fatalf("ingress %q vs %q", ix, iy)
		}
		ingFilter := strings.TrimSuffix(p.Ingress(x.addr, ""), "=") + "*"
		if server.SubjectMatchesFilter(iy, ingFilter) != (x.addr == y.addr) {
			t.Fatalf("ingress filter %q vs %q", ingFilter, iy)
		}
	})
}

// FuzzParseDelivery: whatever a parser accepts is exactly what the builder
// would produce for the parts it returns (so parsing is injective too).
func FuzzParseDelivery(f *testing.F) {
	p := DefaultPrefix
	for _, a := range awkward {
		f.Add(p.Delivery(NodeID{"n", 7}, Address(a), "s.1"))
		f.Add(p.Ingress(Address(a), ""))
	}
	f.Add("mesh.v1.dlv.n.01.echo/x.=")
	f.Add("mesh.v1.in.echo/x.=2e")
	f.Fuzz(func(t *testing.T, subj string) {
		if d, err := p.ParseDelivery(subj); err == nil {
			if again := p.Delivery(d.Node, d.Addr, d.Stream); again != subj {
				t.Fatalf("ParseDelivery accepted %q, which rebuilds as %q", subj, again)
			}
		}
		if a, s, err := p.ParseIngress(subj); err == nil {
			if again := p.Ingress(a, s); again != subj {
				t.Fatalf("ParseIngress accepted %q, which rebuilds as %q", subj, again)
			}
		}
	})
}
