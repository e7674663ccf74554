package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/spf13/cobra"

	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/mesh/reminders"
	"github.com/natsmesh/natsmesh/subjects"
)

func newRemindersCmd(g *globals) *cobra.Command {
	var node string
	rem := &cobra.Command{
		Use:   "reminders",
		Short: "List, set and cancel hubs' durable reminders",
		Long: `List, set and cancel durable reminders (DESIGN §13): each fire is a delivery
of the reminder's type to its address, carrying the reminder's name and due
time, at least once. The request goes to one node's control endpoint
<prefix>.ctl.<node>.reminders (--node, or the first node discovered), which
reads and writes the mesh's reminders stream. A reminder that does not exist
exits 3.`,
	}
	rem.PersistentFlags().StringVar(&node, "node", "", "node name to ask (default: the first node discovered)")

	list := &cobra.Command{
		Use:   "list [ADDRESS]",
		Short: "List the reminders of ADDRESS, or of every address",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := mesh.ReminderRequest{Op: mesh.ReminderList}
			if len(args) == 1 {
				req.Address = subjects.Address(args[0])
				if err := req.Address.Validate(); err != nil {
					return usageErrorf("invalid address: %v", err)
				}
			}
			reply, err := reminderCall(cmd.Context(), g, node, req)
			if err != nil {
				return err
			}
			return printReminders(g, reply)
		},
	}

	var at, in, every, cron, zone, typ, payload string
	var allowPast bool
	set := &cobra.Command{
		Use:   "set ADDRESS NAME (--at TIME | --in DURATION | --every DURATION | --cron EXPR [--zone ZONE])",
		Short: "Set (or replace) the reminder NAME of ADDRESS",
		Long: `Set the reminder NAME of ADDRESS, replacing one of that name. Exactly one of
--at (RFC 3339), --in (from now), --every (at least 1s) and --cron (six fields,
seconds first, or @hourly, @daily, ...; --zone names its IANA time zone).
An --at or --in in the past is refused unless --allow-past (it then fires at
once). Each fire is a delivery of --type with --payload.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := mesh.ReminderRequest{Op: mesh.ReminderSet, Address: subjects.Address(args[0]), Name: args[1],
				Every: every, Cron: cron, Zone: zone, Type: typ}
			if payload != "" {
				req.Payload = []byte(payload)
			}
			if err := req.Address.Validate(); err != nil {
				return usageErrorf("invalid address: %v", err)
			}
			n := 0
			for _, s := range []string{at, in, every, cron} {
				if s != "" {
					n++
				}
			}
			if zone != "" && cron == "" {
				return usageErrorf("--zone is only for --cron")
			}
			if n != 1 {
				return usageErrorf("give exactly one of --at, --in, --every and --cron")
			}
			switch {
			case at != "":
				t, err := time.Parse(time.RFC3339, at)
				if err != nil {
					return usageErrorf("--at: %v", err)
				}
				if !allowPast && t.Before(time.Now()) {
					return usageErrorf("--at %s is in the past (--allow-past fires it at once)", at)
				}
				req.At = t
			case in != "":
				d, err := time.ParseDuration(in)
				if err != nil {
					return usageErrorf("--in: %v", err)
				}
				if !allowPast && d < 0 {
					return usageErrorf("--in %s is in the past (--allow-past fires it at once)", in)
				}
				req.At = time.Now().Add(d)
			case every != "":
				if _, err := time.ParseDuration(every); err != nil {
					return usageErrorf("--every: %v", err)
				}
			case cron != "":
				if err := reminders.ValidateCron(cron); err != nil {
					return usageErrorf("--cron: %v", strings.TrimPrefix(err.Error(), reminders.ErrInvalidReminder.Error()+": "))
				}
			}
			reply, err := reminderCall(cmd.Context(), g, node, req)
			if err != nil {
				return err
			}
			return printReminders(g, reply)
		},
	}
	set.Flags().StringVar(&at, "at", "", "fire once at this RFC 3339 time")
	set.Flags().StringVar(&in, "in", "", "fire once after this duration")
	set.Flags().StringVar(&every, "every", "", "fire at this interval (at least 1s)")
	set.Flags().StringVar(&cron, "cron", "", "fire on this cron expression")
	set.Flags().StringVar(&zone, "zone", "", "IANA time zone of --cron (default UTC)")
	set.Flags().StringVar(&typ, "type", "", "delivery type of each fire")
	set.Flags().StringVar(&payload, "payload", "", "payload of each fire")
	set.Flags().BoolVar(&allowPast, "allow-past", false, "accept an --at or --in in the past (fires at once)")

	cancel := &cobra.Command{
		Use:   "cancel ADDRESS NAME",
		Short: "Cancel the reminder NAME of ADDRESS",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := mesh.ReminderRequest{Op: mesh.ReminderCancel, Address: subjects.Address(args[0]), Name: args[1]}
			if err := req.Address.Validate(); err != nil {
				return usageErrorf("invalid address: %v", err)
			}
			reply, err := reminderCall(cmd.Context(), g, node, req)
			if err != nil {
				return err
			}
			if g.json() {
				return writeJSON(g.stdout, reply)
			}
			if _, err := fmt.Fprintf(g.stdout, "cancelled reminder %s %s\n", req.Address, req.Name); err != nil {
				return exitf(exitUsage, "write output: %v", err)
			}
			return nil
		},
	}
	rem.AddCommand(list, set, cancel)
	return rem
}

// reminderCall sends req to the reminders endpoint of node (or of the first
// node discovered) and decodes its answer.
func reminderCall(ctx context.Context, g *globals, node string, req mesh.ReminderRequest) (mesh.ReminderReply, error) {
	var reply mesh.ReminderReply
	nc, err := g.connect("meshctl reminders")
	if err != nil {
		return reply, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	if node == "" {
		nodes, err := g.discover(ctx, nc)
		if err != nil {
			return reply, err
		}
		if len(nodes) == 0 {
			return reply, g.noNodes()
		}
		node = nodes[0].Name
	} else if err := subjects.ValidateNodeName(node); err != nil {
		return reply, usageErrorf("--node: %v", err)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return reply, exitf(exitUsage, "%v", err)
	}
	m, err := nc.RequestWithContext(ctx, g.controlSubject(node, mesh.ControlReminders), body)
	if errors.Is(err, nats.ErrNoResponders) {
		return reply, exitf(exitVerdict, "no node named %s on prefix %s", node, g.prefix)
	}
	if err != nil {
		return reply, natsError(err, "reminders %s on node %s", req.Op, node)
	}
	if desc := m.Header.Get(micro.ErrorHeader); desc != "" {
		if m.Header.Get(micro.ErrorCodeHeader) == "400" {
			return reply, exitf(exitUsage, "%s", desc)
		}
		return reply, exitf(exitVerdict, "%s", desc)
	}
	if err := json.Unmarshal(m.Data, &reply); err != nil {
		return reply, exitf(exitVerdict, "bad answer from node %s: %v", node, err)
	}
	return reply, nil
}

func printReminders(g *globals, reply mesh.ReminderReply) error {
	var err error
	if g.json() {
		err = writeJSON(g.stdout, reply.Reminders)
	} else {
		now := time.Now()
		t := newTable(g.stdout, "ADDRESS", "NAME", "SCHEDULE", "TYPE", "PAYLOAD BYTES", "SET", "PENDING", "LAST FAILURE")
		for _, r := range reply.Reminders {
			failure := ""
			if r.LastFailure != nil {
				failure = age(r.LastFailure.At, now) + " ago: " + r.LastFailure.Error
				if r.LastFailure.Retrying {
					failure += " (retrying)"
				}
			}
			pending := ""
			if p := r.Pending; p != nil {
				pending = "fire since " + p.Due.UTC().Format(time.RFC3339)
				if p.Retried > 0 {
					pending += fmt.Sprintf(", retried %d times", p.Retried)
				}
			}
			set := ""
			if !r.Set.IsZero() {
				set = age(r.Set, now) + " ago"
			}
			t.row(r.Address, r.Name, r.Schedule, orDash(r.Type), r.PayloadSize, orDash(set), orDash(pending), orDash(failure))
		}
		err = t.flush()
	}
	if err != nil {
		return exitf(exitUsage, "write output: %v", err)
	}
	return nil
}
