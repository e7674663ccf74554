package main

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/internal/natstest"
	"github.com/natsmesh/natsmesh/mesh"
)

// TestReminders: meshctl reminders set, list (table and -o json) and
// cancel through a node's control endpoint; a missing reminder exits 3, a
// bad schedule 1.
func TestReminders(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	node, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: "n1", Logger: slog.New(slog.DiscardHandler),
		Membership: &mesh.MembershipConfig{Heartbeat: 100 * time.Millisecond, TTL: 30 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Close() })

	wantCode(t, meshctl(t, s, "", "reminders", "set", "job/daily", "report", "--cron", "0 0 9 * * *", "--zone", "Europe/Paris", "--type", "run"), 0)
	wantCode(t, meshctl(t, s, "", "reminders", "set", "job/daily", "ping", "--every", "1h"), 0)
	wantCode(t, meshctl(t, s, "", "reminders", "set", "job/other", "once", "--in", "1h", "--payload", "hello"), 0)
	r := meshctl(t, s, "", "reminders", "list", "job/daily")
	wantCode(t, r, 0)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ADDRESS") || !strings.Contains(lines[1], "ping") || !strings.Contains(lines[2], "0 0 9 * * * in Europe/Paris") {
		t.Fatalf("table:\n%s", r.stdout)
	}
	r = meshctl(t, s, "", "-o", "json", "reminders", "list")
	wantCode(t, r, 0)
	var rows []mesh.ReminderRow
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || len(rows) != 3 || rows[2].Name != "once" || rows[2].PayloadSize != 5 {
		t.Fatalf("json %v: %s", err, r.stdout)
	}
	wantCode(t, meshctl(t, s, "", "reminders", "cancel", "job/daily", "ping"), 0)
	wantCode(t, meshctl(t, s, "", "reminders", "cancel", "job/daily", "ping"), exitVerdict)
	wantCode(t, meshctl(t, s, "", "reminders", "set", "job/daily", "x", "--every", "100ms"), exitUsage)
	wantCode(t, meshctl(t, s, "", "reminders", "set", "job/daily", "x"), exitUsage)
	if r := meshctl(t, s, "", "reminders", "list", "job/daily"); !strings.Contains(r.stdout, "report") || strings.Contains(r.stdout, "ping") {
		t.Fatalf("after cancel:\n%s", r.stdout)
	}
}

// TestRemindersSetRefusesWhatTheServerWould: a five-field cron, an --in
// or --at in the past exit 1 with a message saying why, before any node
// is asked; --allow-past accepts the past; cancel names what it cancelled,
// and "no such reminder" names what it did not find.
func TestRemindersSetRefusesWhatTheServerWould(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	node, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: "n1", Logger: slog.New(slog.DiscardHandler),
		Membership: &mesh.MembershipConfig{Heartbeat: 100 * time.Millisecond, TTL: 30 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Close() })

	r := meshctl(t, s, "", "reminders", "set", "job/a", "c", "--cron", "*/5 * * * *")
	wantCode(t, r, exitUsage)
	if !strings.Contains(r.stderr, "six fields") || !strings.Contains(r.stderr, "seconds first") {
		t.Fatalf("five-field cron: %s", r.stderr)
	}
	wantCode(t, meshctl(t, s, "", "reminders", "set", "job/a", "c", "--cron", "@fortnightly"), exitUsage)
	if r := meshctl(t, s, "", "reminders", "set", "job/a", "c", "--every", "5s", "--zone", "Europe/Paris"); r.code != exitUsage || !strings.Contains(r.stderr, "--zone is only for --cron") {
		t.Fatalf("--zone without --cron: exit %d, %q", r.code, r.stderr)
	}
	wantCode(t, meshctl(t, s, "", "reminders", "set", "job/a", "c", "--cron", "0 */5 * * * *"), 0)
	wantCode(t, meshctl(t, s, "", "reminders", "set", "job/a", "d", "--cron", "@hourly"), 0)
	for _, args := range [][]string{{"--in", "-5s"}, {"--at", time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)}} {
		r := meshctl(t, s, "", append([]string{"reminders", "set", "job/a", "p"}, args...)...)
		wantCode(t, r, exitUsage)
		if !strings.Contains(r.stderr, "in the past") {
			t.Fatalf("%v: %s", args, r.stderr)
		}
	}
	wantCode(t, meshctl(t, s, "", "reminders", "set", "job/a", "p", "--in", "-5s", "--allow-past"), 0)

	r = meshctl(t, s, "", "reminders", "cancel", "job/a", "c")
	wantCode(t, r, 0)
	if !strings.Contains(r.stdout, "job/a") || !strings.Contains(r.stdout, " c") {
		t.Fatalf("cancel printed %q", r.stdout)
	}
	r = meshctl(t, s, "", "reminders", "cancel", "job/a", "c")
	wantCode(t, r, exitVerdict)
	if !strings.Contains(r.stderr, "no such reminder") || !strings.Contains(r.stderr, "job/a c") {
		t.Fatalf("second cancel: %s", r.stderr)
	}
}

// TestRemindersNoPlacementListedAndCancelled: a reminder at a kind no
// node hosts keeps its fire pending; list shows it (pending fire, the
// no-placement failure) and cancel drops it.
func TestRemindersNoPlacementListedAndCancelled(t *testing.T) {
	t.Parallel()
	s := natstest.RunServer(t)
	nc := natstest.Connect(t, s)
	node, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: "n1", Logger: slog.New(slog.DiscardHandler),
		Membership: &mesh.MembershipConfig{Heartbeat: 100 * time.Millisecond, TTL: 30 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Close() })

	wantCode(t, meshctl(t, s, "", "reminders", "set", "ecko/c", "c6", "--in", "200ms"), 0)
	var r result
	natstest.Eventually(t, 15*time.Second, func() bool {
		r = meshctl(t, s, "", "reminders", "list", "ecko/c")
		return r.code == 0 && strings.Contains(r.stdout, "fire since") && strings.Contains(r.stdout, "(retrying)")
	}, "the pending fire is not listed")
	if !strings.Contains(r.stdout, "c6") || !strings.Contains(r.stdout, "no live node") {
		t.Fatalf("list:\n%s", r.stdout)
	}
	r = meshctl(t, s, "", "-o", "json", "reminders", "list", "ecko/c")
	var rows []mesh.ReminderRow
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || len(rows) != 1 || rows[0].Pending == nil || rows[0].LastFailure == nil {
		t.Fatalf("json %v: %s", err, r.stdout)
	}
	r = meshctl(t, s, "", "reminders", "cancel", "ecko/c", "c6")
	wantCode(t, r, 0)
	natstest.Eventually(t, 15*time.Second, func() bool {
		r = meshctl(t, s, "", "reminders", "list", "ecko/c")
		return r.code == 0 && !strings.Contains(r.stdout, "c6")
	}, "the cancelled reminder is still listed")
	wantCode(t, meshctl(t, s, "", "reminders", "cancel", "ecko/c", "c6"), exitVerdict)
}
