package integration

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/mesh/reminders"
	"github.com/natsmesh/natsmesh/subjects"
)

// fireLateness bounds how late a fire is executed in these tests when a
// fault came between its Set and its due time: the owner's takeover (TTL
// 1 s of testnode, the fencing delay) or the cluster's restart, then the
// sender's retry ladder.
const fireLateness = 20 * time.Second

// reminderClient is a node of the test's own that runs no reminder runner
// (so every fire is delivered by a testnode process) and hosts nothing.
func reminderClient(t *testing.T, url string) *mesh.Node {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name(membership.ConnNamePrefix+"rc"), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	n, err := mesh.NewNode(mesh.NodeConfig{
		Conn: nc, Name: "rc", DisableIngress: true, DisableControl: true, Logger: slog.New(slog.DiscardHandler),
		Membership: &mesh.MembershipConfig{Heartbeat: testHeartbeat, TTL: testTTL, Replicas: 3, DisableReminders: true},
	}, mesh.WithSaturationThreshold(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// reminderStore opens the reminders stream on a plain connection: any
// client with the node profile may set reminders.
func reminderStore(t *testing.T, url string) *reminders.Store {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	var st *reminders.Store
	natstest.Eventually(t, 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err = reminders.Open(ctx, reminders.Config{Conn: nc, Replicas: 3})
		return err == nil
	}, "reminders stream not bound: %v", err)
	return st
}

// fires returns the executions of reminder fires at addr, by delivery ID.
func (e *execLog) fires(addr string) map[string][]*nats.Msg {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string][]*nats.Msg{}
	for _, m := range e.events {
		if m.Header.Get("Test-Address") == addr && m.Header.Get("Test-Reminder") != "" {
			out[m.Header.Get("Mesh-Id")] = append(out[m.Header.Get("Mesh-Id")], m)
		}
	}
	return out
}

// ownerOf activates addr with one request and returns the node that ran it.
func ownerOf(t *testing.T, tc *mesh.Node, execs *execLog, addr subjects.Address) string {
	t.Helper()
	if _, err := tc.Request(context.Background(), mesh.Delivery{To: addr, Payload: []byte("warm")}); err != nil {
		t.Fatal(err)
	}
	var node string
	natstest.Eventually(t, 10*time.Second, func() bool {
		execs.mu.Lock()
		defer execs.mu.Unlock()
		for _, m := range execs.events {
			if m.Header.Get("Test-Address") == string(addr) {
				node = m.Header.Get("Test-Node")
				return true
			}
		}
		return false
	}, "no execution at %s", addr)
	return node
}

// TestReminderAcrossOwnerSIGKILL: reminders set on addresses that one node
// owns; that node is SIGKILLed before they are due. The surviving node
// delivers them: the one-shot runs once, the interval keeps firing, each
// fire once.
func TestReminderAcrossOwnerSIGKILL(t *testing.T) {
	longTest(t)
	c := StartCluster(t, 3)
	c.WaitReady(t)
	nodes := startTestNodes(t, c.URL(), "ra", "rb")
	tc := reminderClient(t, c.URL())
	waitHosting(t, tc, "count", 2)
	execs := subscribeExecs(t, c.URL())
	st := reminderStore(t, c.URL())

	victim := ownerOf(t, tc, execs, "count/once")
	var every subjects.Address
	for i := 0; every == ""; i++ {
		a := subjects.Address("count/every" + string(rune('a'+i)))
		if ownerOf(t, tc, execs, a) == victim {
			every = a
		}
	}
	survivor := map[string]string{"ra": "rb", "rb": "ra"}[victim]
	ctx := context.Background()
	due := time.Now().Add(3 * time.Second)
	if _, err := st.Set(ctx, reminders.Reminder{Address: "count/once", Name: "wake", Schedule: reminders.At(due), Type: "wake"}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Set(ctx, reminders.Reminder{Address: every, Name: "beat", Schedule: reminders.Every(time.Second)}); err != nil {
		t.Fatal(err)
	}
	if err := nodes[victim].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	nodes[victim].Wait(t, 10*time.Second)

	natstest.Eventually(t, time.Until(due)+fireLateness, func() bool { return len(execs.fires("count/once")) == 1 },
		"the one-shot did not fire after its owner's SIGKILL")
	natstest.Eventually(t, 30*time.Second, func() bool { return len(execs.fires(string(every))) >= 3 },
		"the interval did not keep firing after its owner's SIGKILL")
	// Nothing of the one-shot is left to fire again, and each fire ran
	// once, on the survivor.
	var left reminders.Reminder
	if !natstest.Poll(30*time.Second, func() bool {
		var err error
		left, err = st.Get(ctx, "count/once", "wake")
		return err != nil
	}) {
		t.Fatalf("the one-shot is still stored 30 s after it fired: %s", reminderLeft(left))
	}
	for addr, byID := range map[subjects.Address]map[string][]*nats.Msg{"count/once": execs.fires("count/once"), every: execs.fires(string(every))} {
		for id, ms := range byID {
			if len(ms) != 1 {
				t.Fatalf("%s: fire %s executed %d times", addr, id, len(ms))
			}
			if n := ms[0].Header.Get("Test-Node"); n != survivor {
				t.Fatalf("%s: fire %s executed on %s, want the survivor %s", addr, id, n, survivor)
			}
		}
	}
	for _, ms := range execs.fires("count/once") {
		at, _ := time.Parse(time.RFC3339Nano, ms[0].Header.Get("Test-Due"))
		if !at.Equal(due.Truncate(time.Millisecond)) {
			t.Fatalf("due %v, want %v", at, due)
		}
		t.Logf("one-shot due %v after the SIGKILL, executed on %s", due.Sub(killed).Round(time.Millisecond), ms[0].Header.Get("Test-Node"))
	}
}

// TestReminderAcrossNATSServerRestart: every server of the cluster (file
// storage, three replicas) is killed after the reminders were set and
// restarted after the one-shot's due time: the one-shot fires once, late;
// the interval resumes; each fire runs once.
func TestReminderAcrossNATSServerRestart(t *testing.T) {
	longTest(t)
	c := StartCluster(t, 3)
	c.WaitReady(t)
	startTestNodes(t, c.URL(), "sa", "sb")
	tc := reminderClient(t, c.URL())
	waitHosting(t, tc, "count", 2)
	execs := subscribeExecs(t, c.URL())
	st := reminderStore(t, c.URL())
	ctx := context.Background()
	due := time.Now().Add(2 * time.Second)
	if _, err := st.Set(ctx, reminders.Reminder{Address: "count/r1", Name: "wake", Schedule: reminders.At(due)}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Set(ctx, reminders.Reminder{Address: "count/r2", Name: "beat", Schedule: reminders.Every(time.Second)}); err != nil {
		t.Fatal(err)
	}
	for i := range c.N() {
		c.Kill(i)
	}
	// Down past the one-shot's due time.
	for time.Now().Before(due.Add(time.Second)) {
		time.Sleep(50 * time.Millisecond)
	}
	for i := range c.N() {
		c.Restart(i)
	}
	restarted := time.Now()
	c.WaitReady(t)
	natstest.Eventually(t, fireLateness+30*time.Second, func() bool { return len(execs.fires("count/r1")) == 1 },
		"the one-shot due while the servers were down did not fire after their restart")
	natstest.Eventually(t, 60*time.Second, func() bool { return len(execs.fires("count/r2")) >= 2 },
		"the interval did not resume after the restart")
	for _, addr := range []string{"count/r1", "count/r2"} {
		for id, ms := range execs.fires(addr) {
			if len(ms) != 1 {
				t.Fatalf("%s: fire %s executed %d times", addr, id, len(ms))
			}
		}
	}
	for _, ms := range execs.fires("count/r1") {
		t.Logf("one-shot executed on %s after the restart (due %v before it)", ms[0].Header.Get("Test-Node"), restarted.Sub(due).Round(time.Millisecond))
	}
	if r, err := st.Get(ctx, "count/r2", "beat"); err != nil || !strings.HasPrefix(r.Schedule.String(), "@every") {
		t.Fatalf("interval after the restart: %+v %v", r, err)
	}
}

// reminderLeft says what Get still found of a reminder: its schedule, a
// fire not yet delivered, or its recorded failure.
func reminderLeft(r reminders.Reminder) string {
	b, _ := json.Marshal(r)
	return string(b)
}
