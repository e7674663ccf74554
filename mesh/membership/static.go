package membership

import (
	"time"

	"github.com/natsmesh/natsmesh/subjects"
)

// Static is the cluster view of a process that takes no part in
// membership: a standalone sender (mesh.NewClient without a Node), which
// gets it by default. It never changes: it knows no members, sees no
// generation alive, gone or known, hosts nothing and emits no event. The
// zero value is ready to use.
//
// What a sender on it therefore learns, and what it does not:
//   - An owner's departure only from the legs it sends to it: NATS no
//     responders (nothing subscribes the departed generation's subject any
//     more) and the intake's refusals ("not the owner", shutting down),
//     both resendable, so the delivery is re-resolved and re-sent — one
//     round trip later than a node's sender, which the view tells at once.
//   - Not that a generation that accepted a Request departed: its awaited
//     response is not failed early (a crashed owner's ends at the
//     caller's deadline as a timeout, outcome unknown); a draining owner
//     still answers what it accepted with its late verdict.
//   - Its own link's drop, its own closing and an owner's connection moving
//     are the client's own facts, not the view's: they are told as with a
//     node.
//
// It lets nothing be taken over (a claimer must see a departure first), so
// it cannot back a directory that claims (package directory).
type Static struct{}

var _ View = Static{}

// Self is the zero member: a static view's process is no registered
// generation.
func (Static) Self() Member { return Member{} }

// Members is empty.
func (Static) Members() []Member { return nil }

// Alive is false: a static view sees no generation alive.
func (Static) Alive(subjects.NodeID) bool { return false }

// Gone is false: a static view sees no departure (the sender learns one
// from its legs).
func (Static) Gone(subjects.NodeID) bool { return false }

// Known is false.
func (Static) Known(subjects.NodeID) bool { return false }

// Hosting is empty.
func (Static) Hosting(string) []subjects.NodeID { return nil }

// HostingNear is empty.
func (Static) HostingNear(string, string) []subjects.NodeID { return nil }

// TakeoverAt is a TTL from now, every time it is asked: never.
func (s Static) TakeoverAt(subjects.NodeID) time.Time { return time.Now().Add(s.TTL()) }

// UnseenTakeoverAt is a TTL from now, every time it is asked: never.
func (s Static) UnseenTakeoverAt(time.Time) time.Time { return time.Now().Add(s.TTL()) }

// TTL is DefaultTTL.
func (Static) TTL() time.Duration { return DefaultTTL }

// OnEvent never calls f: nothing changes.
func (Static) OnEvent(func(Event)) (cancel func()) { return func() {} }
