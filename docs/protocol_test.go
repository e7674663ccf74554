// Package docs holds the project's documentation; its tests run the
// examples that docs/protocol.md shows and compare their output with what
// the page says.
package docs

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/hubs"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// example is one `nats req` of docs/protocol.md with the output shown.
type example struct {
	line       int
	command    string
	subject    string
	payload    string
	headers    nats.Header
	standalone bool              // "# on meshd --standalone"
	want       map[string]string // Mesh-* headers shown
	body       string            // "nil body" is ""
}

var headerLine = regexp.MustCompile(`^(?:\S+\s+)?(Mesh-[A-Za-z-]+): (.*)$`)

// section returns the lines of the section of protocol.md whose heading
// starts with heading, and the line number of its first line.
func section(t *testing.T, heading string) ([]string, int) {
	t.Helper()
	f, err := os.Open("protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	first, in := 0, false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		if strings.HasPrefix(l, "## ") {
			if in {
				break
			}
			in, first = strings.HasPrefix(l, heading), n+1
			continue
		}
		if in {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		t.Fatalf("protocol.md has no section %q", heading)
	}
	return out, first
}

// shellWords splits a command line as a shell would for the simple quoting
// the examples use (single quotes), up to a "#" comment.
func shellWords(s string) (words []string, comment string) {
	var w strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quoted && c == '\'':
			quoted = false
		case quoted:
			w.WriteByte(c)
		case c == '\'':
			quoted, inWord = true, true
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case c == '#' && !inWord:
			return words, strings.TrimSpace(s[i+1:])
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, ""
}

// examples parses every `$ nats req` in the code blocks of lines.
func examples(t *testing.T, lines []string, first int) []example {
	t.Helper()
	var out []example
	var cur *example
	inBlock, sawBlank := false, false
	flush := func() {
		if cur != nil {
			out = append(out, *cur)
			cur = nil
		}
	}
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			flush()
			inBlock = !inBlock
			continue
		}
		if !inBlock {
			continue
		}
		if cmd, ok := strings.CutPrefix(l, "$ nats req "); ok {
			flush()
			words, comment := shellWords(cmd)
			if len(words) < 2 {
				t.Fatalf("protocol.md:%d: cannot read %q", first+i, l)
			}
			cur = &example{line: first + i, command: l, subject: words[0], payload: words[1], headers: nats.Header{},
				standalone: strings.Contains(comment, "--standalone"), want: map[string]string{}}
			for j := 2; j < len(words); j++ {
				if words[j] != "-H" || j+1 == len(words) {
					t.Fatalf("protocol.md:%d: unexpected argument %q", first+i, words[j])
				}
				k, v, _ := strings.Cut(words[j+1], ":")
				cur.headers.Set(k, v)
				j++
			}
			sawBlank = false
			continue
		}
		if cur == nil {
			continue
		}
		switch m := headerLine.FindStringSubmatch(l); {
		case m != nil:
			cur.want[m[1]] = m[2]
		case strings.TrimSpace(l) == "":
			sawBlank = true
		case sawBlank:
			if l != "nil body" {
				cur.body = l
			}
		}
	}
	flush()
	return out
}

// startNode runs node n1 hosting echo on s: standalone with generation 7, or
// with membership (its generation comes from the registry).
func startNode(t *testing.T, s *server.Server, standalone bool) *mesh.Node {
	t.Helper()
	return start(t, s, "n1", standalone, nil)
}

// startNamed runs a member node name hosting echo on s.
func startNamed(t *testing.T, s *server.Server, name string) *mesh.Node {
	t.Helper()
	return start(t, s, name, false, nil)
}

// start runs a node hosting echo and the extra kinds.
func start(t *testing.T, s *server.Server, name string, standalone bool, extra map[string]hub.Factory) *mesh.Node {
	t.Helper()
	cfg := mesh.NodeConfig{Conn: natstest.Connect(t, s), Name: name, Logger: slog.New(slog.DiscardHandler)}
	if standalone {
		cfg.Generation = 7
	} else {
		cfg.Membership = &mesh.MembershipConfig{}
	}
	n, err := mesh.NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Register(hubs.EchoKind, hubs.Echo); err != nil {
		t.Fatal(err)
	}
	for k, f := range extra {
		if err := n.Register(k, f); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// TestWorkedExamples runs each `nats req` of protocol.md §7 against a real
// node — with membership, as meshd runs by default, or standalone where the
// example says so — and compares the reply's Mesh-* headers and body with
// the page. The page's node n1.7 stands for the node's actual generation.
func TestWorkedExamples(t *testing.T) {
	lines, first := section(t, "## 7.")
	exs := examples(t, lines, first)
	if len(exs) < 4 {
		t.Fatalf("found %d examples in §7, want at least 4", len(exs))
	}
	type setup struct {
		node *mesh.Node
		nc   *nats.Conn
	}
	setups := map[bool]setup{}
	for _, standalone := range []bool{false, true} {
		s := natstest.RunServer(t)
		setups[standalone] = setup{startNode(t, s, standalone), natstest.Connect(t, s)}
	}
	for _, ex := range exs {
		node, nc := setups[ex.standalone].node, setups[ex.standalone].nc
		m := nats.NewMsg(ex.subject)
		m.Data = []byte(ex.payload)
		for k, vs := range ex.headers {
			m.Header[k] = vs
		}
		reply, err := nc.RequestMsg(m, 35*time.Second)
		if err != nil {
			t.Errorf("protocol.md:%d: %s: %v", ex.line, ex.command, err)
			continue
		}
		got := map[string]string{}
		for k := range reply.Header {
			if strings.HasPrefix(k, "Mesh-") {
				got[k] = strings.ReplaceAll(reply.Header.Get(k), node.ID().String(), "n1.7")
			}
		}
		for k, v := range ex.want {
			if got[k] != v {
				t.Errorf("protocol.md:%d: %s\n  %s: got %q, the page says %q", ex.line, ex.command, k, got[k], v)
			}
		}
		for k, v := range got {
			if _, ok := ex.want[k]; !ok {
				t.Errorf("protocol.md:%d: %s\n  reply has %s: %q, which the page does not show", ex.line, ex.command, k, v)
			}
		}
		if string(reply.Data) != ex.body {
			t.Errorf("protocol.md:%d: %s\n  body %q, the page says %q", ex.line, ex.command, reply.Data, ex.body)
		}
	}
}

// replyExample is one reply of protocol.md §4.3: the case (its comment) and
// the headers shown.
type replyExample struct {
	line    int
	comment string
	want    map[string]string
}

func replyExamples(t *testing.T) []replyExample {
	lines, first := section(t, "## 4.")
	var out []replyExample
	in, block := false, false
	for i, l := range lines {
		if strings.HasPrefix(l, "### 4.3") {
			in = true
			continue
		}
		if !in {
			continue
		}
		if strings.HasPrefix(l, "```") {
			if block {
				break
			}
			block = true
			continue
		}
		if !block {
			continue
		}
		if strings.TrimSpace(l) == "" {
			continue
		}
		hdr, comment, _ := strings.Cut(l, "#")
		if comment != "" {
			out = append(out, replyExample{line: first + i, comment: strings.TrimSpace(comment), want: map[string]string{}})
		}
		k, v, ok := strings.Cut(strings.TrimSpace(hdr), ": ")
		if !ok || len(out) == 0 {
			t.Fatalf("protocol.md:%d: cannot read %q", first+i, l)
		}
		out[len(out)-1].want[k] = v
	}
	return out
}

// TestReplyExamples produces each reply of protocol.md §4.3 on real nodes
// and compares the headers the page shows (the page's n1.7 and n2.9 stand
// for the nodes' actual generations).
func TestReplyExamples(t *testing.T) {
	exs := replyExamples(t)
	if len(exs) != 4 {
		t.Fatalf("found %d replies in §4.3, want 4", len(exs))
	}
	// A standalone n1.7 with echo and a kind whose handler blocks.
	s1 := natstest.RunServer(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	started := make(chan struct{}, 1)
	n1 := start(t, s1, "n1", true, map[string]hub.Factory{"slow": func(ctx context.Context, _ subjects.Address) (hub.Hub, error) {
		return hub.HandlerFunc(func(ctx context.Context, _ *hub.Delivery) error {
			select {
			case started <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return nil
		}), nil
	}})
	nc1 := natstest.Connect(t, s1)
	send := func(nc *nats.Conn, node subjects.NodeID, addr subjects.Address, id string) *nats.Msg {
		t.Helper()
		m := nats.NewMsg(subjects.DefaultPrefix.Delivery(node, addr, ""))
		if id != "" {
			m.Header.Set(hub.HeaderID, id)
		}
		r, err := nc.RequestMsg(m, 10*time.Second)
		if err != nil {
			t.Fatalf("deliver %s to %s on %s: %v", id, addr, node, err)
		}
		return r
	}
	// Two members n1 and n2, n2 owning echo/x.
	s2 := natstest.RunServer(t)
	m1, m2 := startNode(t, s2, false), startNamed(t, s2, "n2")
	nc2 := natstest.Connect(t, s2)
	if v := send(nc2, m2.ID(), "echo/x", "own-1").Header.Get(verdict.HeaderVerdict); v != "Accepted" {
		t.Fatalf("n2 did not take echo/x: %s", v)
	}

	for _, ex := range exs {
		var reply *nats.Msg
		names := map[string]string{n1.ID().String(): "n1.7"}
		switch {
		case strings.HasPrefix(ex.comment, "accepted by"):
			reply = send(nc1, n1.ID(), "echo/x", "acc-1")
		case strings.Contains(ex.comment, "no Mesh-Id"):
			reply = send(nc1, n1.ID(), "echo/x", "")
		case strings.Contains(ex.comment, "owns the address"):
			names = map[string]string{m1.ID().String(): "n1.7", m2.ID().String(): "n2.9"}
			reply = send(nc2, m1.ID(), "echo/x", "own-2")
		case strings.Contains(ex.comment, "inbox full"):
			send(nc1, n1.ID(), "slow/1", "slow-0")
			<-started // the handler holds slow-0; the inbox is empty
			for i := range hub.DefaultInboxSize {
				if v := send(nc1, n1.ID(), "slow/1", fmt.Sprintf("slow-%d", i+1)).Header.Get(verdict.HeaderVerdict); v != "Accepted" {
					t.Fatalf("filling the inbox: delivery %d: %s", i+1, v)
				}
			}
			reply = send(nc1, n1.ID(), "slow/1", "slow-over")
		default:
			t.Fatalf("protocol.md:%d: no test produces the case %q", ex.line, ex.comment)
		}
		for k, v := range ex.want {
			got := reply.Header.Get(k)
			for id, doc := range names {
				got = strings.ReplaceAll(got, id, doc)
			}
			if got != v {
				t.Errorf("protocol.md:%d (%s): %s: got %q, the page says %q", ex.line, ex.comment, k, got, v)
			}
		}
	}
}
