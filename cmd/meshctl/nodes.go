package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
)

// withNodes connects, discovers the nodes of the prefix and asks each for
// verb; the answers are printed by print even when some node failed, and the
// failure is returned after. No node at all is exit 3 (with -o json, after
// printing []).
func withNodes[T any](cmd *cobra.Command, g *globals, verb string, sortKey func(T) string, print func([]T) error) error {
	nc, err := g.connect("meshctl " + cmd.Name())
	if err != nil {
		return err
	}
	defer nc.Close()
	nodes, err := g.discover(cmd.Context(), nc)
	if err != nil {
		return err
	}
	if len(nodes) == 0 {
		if g.json() {
			_ = writeJSON(g.stdout, []T{}) // still valid JSON for a pipe
		}
		return g.noNodes()
	}
	vals, cerr := control[T](cmd.Context(), g, nc, nodes, verb)
	slices.SortFunc(vals, func(a, b T) int { return compareNodes(sortKey(a), sortKey(b)) })
	if vals == nil {
		vals = []T{} // JSON [] rather than null
	}
	if err := print(vals); err != nil {
		return exitf(exitUsage, "write output: %v", err)
	}
	return cerr
}

func newNodesCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "nodes",
		Short: "List the mesh's nodes",
		Long: `List the nodes of the mesh (of --prefix): discovered as the NATS micro service
"natsmesh", then each asked for its status on <prefix>.ctl.<name>.ping.
-o json prints an array of NodeStatus. No node answering exits 3.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withNodes(cmd, g, mesh.ControlPing, func(s mesh.NodeStatus) string { return s.Node },
				func(st []mesh.NodeStatus) error {
					if g.json() {
						return writeJSON(g.stdout, st)
					}
					now := time.Now()
					t := newTable(g.stdout, "NAME", "GENERATION", "VERSION", "STARTED", "KINDS", "ACTIVATIONS", "CLAIMS", "LEGS IN FLIGHT", "MEMBERSHIP", "DRAINING")
					for _, s := range st {
						claims := "-"
						if s.Membership != nil {
							claims = fmt.Sprint(s.Membership.Claims)
						}
						t.row(s.Name, s.Generation, s.Version, age(s.Started, now), orDash(strings.Join(s.Kinds, ",")),
							s.Host.Activations, claims, s.Saturation.LegsInFlight, membershipState(s), yesNo(s.Draining))
					}
					return t.flush()
				})
		},
	}
}

// membershipState reads a node's registry entry as that node sees it:
// "standalone" without membership, else "member" or "draining" with the
// number of live node generations it sees (subscribers, such as meshctl
// subscribe, counted apart) and the rejoins it made.
func membershipState(s mesh.NodeStatus) string {
	m := s.Membership
	if m == nil {
		return "standalone"
	}
	state := "member"
	nodes, subscribers := 0, 0
	for _, v := range m.Members {
		if v.Node.String() == s.Node && v.Draining {
			state = "draining"
		}
		if v.Subscriber {
			subscribers++
		} else {
			nodes++
		}
	}
	out := fmt.Sprintf("%s (sees %d)", state, nodes)
	if subscribers > 0 {
		out = fmt.Sprintf("%s (sees %d, +%d subscriber)", state, nodes, subscribers)
		if subscribers > 1 {
			out = strings.TrimSuffix(out, ")") + "s)"
		}
	}
	if m.Rejoins > 0 {
		out += fmt.Sprintf(", rejoined %d×", m.Rejoins)
	}
	return out
}

// maxAddressesShown is how many addresses a hubs table row lists.
const maxAddressesShown = 3

func newHubsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "hubs",
		Short: "List each node's hub kinds and activations",
		Long: `List each node's hub kinds and live activations (its HubsReport, from
<prefix>.ctl.<name>.hubs). The table shows the first addresses; -o json prints
an array of HubsReport with up to 1000 addresses per node. No node answering
exits 3.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withNodes(cmd, g, mesh.ControlHubs, func(r mesh.HubsReport) string { return r.Node },
				func(rs []mesh.HubsReport) error {
					if g.json() {
						return writeJSON(g.stdout, rs)
					}
					t := newTable(g.stdout, "NODE", "KINDS", "ACTIVATIONS", "ADDRESSES")
					for _, r := range rs {
						addrs := r.Addresses
						more := r.Activations - min(len(addrs), maxAddressesShown)
						if len(addrs) > maxAddressesShown {
							addrs = addrs[:maxAddressesShown]
						}
						list := strings.Join(addrs, ", ")
						if more > 0 {
							list += fmt.Sprintf(" (+%d more)", more)
						}
						t.row(r.Node, orDash(strings.Join(r.Kinds, ",")), r.Activations, orDash(list))
					}
					return t.flush()
				})
		},
	}
}

func newStatsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Show each node's saturation report and counters",
		Long: `Show each node's counters (from <prefix>.ctl.<name>.stats): the sending side's
saturation report, the hub host's counters and the client's counters.
-o json prints an array of NodeStatus.

Saturation tells breadth from head-of-line blocking: many lanes and
destinations with shallow depth is breadth; one deep lane is a blocked lane.
No node answering exits 3.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withNodes(cmd, g, mesh.ControlStats, func(s mesh.NodeStatus) string { return s.Node },
				func(st []mesh.NodeStatus) error {
					if g.json() {
						return writeJSON(g.stdout, st)
					}
					return printStats(g, st)
				})
		},
	}
}

func printStats(g *globals, st []mesh.NodeStatus) error {
	w := g.stdout
	fmt.Fprintln(w, "SATURATION (sending side)")
	t := newTable(w, "NODE", "LEGS IN FLIGHT", "PEAK", "MAX", "LANES", "DESTINATIONS", "DEEPEST DEPTH", "DEEPEST LANE", "EPISODE", "SATURATED")
	for _, s := range st {
		sat := s.Saturation
		deepest := "-"
		if sat.DeepestDepth > 0 {
			deepest = string(sat.Deepest.Addr)
			if sat.Deepest.Stream != "" {
				deepest += " stream " + string(sat.Deepest.Stream)
			}
		}
		t.row(s.Node, sat.LegsInFlight, sat.PeakInFlight, sat.MaxInFlight, sat.Lanes, sat.Destinations,
			sat.DeepestDepth, deepest, sat.Episode, yesNo(sat.Saturated))
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "HOST (receiving side)")
	t = newTable(w, "NODE", "ACCEPTED", "DEDUPE HITS", "REFUSED", "HANDLED", "LATE", "ACTIVATIONS", "QUEUED", "DEACTIVATED", "INGRESS", "DRAINING")
	for _, s := range st {
		h := s.Host
		t.row(s.Node, h.Accepted, h.DedupeHits, h.Refused, h.Handled, h.Late, h.Activations, h.Queued, h.Deactivated, s.Ingress, yesNo(s.Draining))
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "CLIENT (deliveries sent by the node)")
	t = newTable(w, "NODE", "ACCEPTED", "FAILED", "RETRIES", "FAILURES BY VERDICT")
	for _, s := range st {
		var by []string
		for v, n := range s.Client.ByVerdict {
			if v != "Accepted" && n > 0 {
				by = append(by, fmt.Sprintf("%s=%d", v, n))
			}
		}
		slices.Sort(by)
		t.row(s.Node, s.Client.Accepted, s.Client.Failed, s.Client.Retries, orDash(strings.Join(by, " ")))
	}
	return t.flush()
}

func newDrainCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "drain NODE",
		Short: "Drain a node: it stops taking work, settles what it holds and stops",
		Long: `Ask the node named NODE (its name, without generation) to drain, on
<prefix>.ctl.<NODE>.drain, and print its acknowledgement; the drain runs after
it. Every live generation of that name drains. No node of that name exits 3.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := subjects.ValidateNodeName(name); err != nil {
				if id, perr := subjects.ParseNodeID(name); perr == nil {
					return usageErrorf("give the node name %q, not the generation %q", id.Name, name)
				}
				return usageErrorf("%v", err)
			}
			nc, err := g.connect("meshctl drain")
			if err != nil {
				return err
			}
			defer nc.Close()
			replies, err := drain(cmd.Context(), g, nc, name)
			if err != nil {
				return err
			}
			if g.json() {
				err = writeJSON(g.stdout, replies)
			} else {
				t := newTable(g.stdout, "NODE", "DRAINING")
				for _, r := range replies {
					t.row(r.Node, yesNo(r.Draining))
				}
				err = t.flush()
			}
			if err != nil {
				return exitf(exitUsage, "write output: %v", err)
			}
			return nil
		},
	}
}

func drain(ctx context.Context, g *globals, nc *nats.Conn, name string) ([]mesh.DrainReply, error) {
	subject := g.controlSubject(name, mesh.ControlDrain)
	msgs, gone, err := gather(ctx, nc, subject, nil, 0, g.timeout)
	if err != nil {
		return nil, natsError(err, "drain %s", name)
	}
	if gone {
		return nil, exitf(exitVerdict, "no node named %s on prefix %s", name, g.prefix)
	}
	if len(msgs) == 0 {
		return nil, exitf(exitTimeout, "node %s did not answer the drain request in %v", name, g.timeout)
	}
	var out []mesh.DrainReply
	for _, m := range msgs {
		if err := serviceError(m); err != nil {
			return nil, exitf(exitVerdict, "drain of node %s: %v", name, err)
		}
		var r mesh.DrainReply
		if err := json.Unmarshal(m.Data, &r); err != nil {
			return nil, exitf(exitVerdict, "drain of node %s: bad answer: %v", name, err)
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b mesh.DrainReply) int { return compareNodes(a.Node, b.Node) })
	return out, nil
}
