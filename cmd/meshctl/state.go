package main

import (
	"context"
	"encoding/json"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/mesh"
	"github.com/natsmesh/natsmesh/subjects"
)

// stateRecord is the JSON form of a hub's stored state (meshctl state get
// -o json): Value holds the state when it is UTF-8 text, ValueBase64
// otherwise.
type stateRecord struct {
	Address     string    `json:"address"`
	Owner       string    `json:"owner"`
	Epoch       uint64    `json:"epoch"`
	Revision    uint64    `json:"revision"`
	Updated     time.Time `json:"updated"`
	Bytes       int       `json:"bytes"`
	Value       *string   `json:"value,omitempty"`
	ValueBase64 []byte    `json:"value_base64,omitempty"`
}

// readState asks the nodes of --prefix, in name order, for addr's stored
// state until one answers it: not found is exit 3, a node without a state
// store is skipped, any other failure of the read is exit 3 naming it.
func readState(ctx context.Context, g *globals, nc *nats.Conn, addr subjects.Address) (hub.StateRecord, error) {
	nodes, err := g.discover(ctx, nc)
	if err != nil {
		return hub.StateRecord{}, err
	}
	if len(nodes) == 0 {
		return hub.StateRecord{}, g.noNodes()
	}
	q, _ := json.Marshal(mesh.StateQuery{Address: string(addr)})
	var last error
	for _, n := range nodes {
		msgs, gone, err := gather(ctx, nc, g.controlSubject(n.Name, mesh.ControlState), q, 1, g.timeout)
		if err != nil {
			return hub.StateRecord{}, natsError(err, "read state of %s", addr)
		}
		if gone || len(msgs) == 0 {
			last = exitf(exitTimeout, "node %s did not answer the state read of %s in %v", n.Name, addr, g.timeout)
			continue
		}
		if err := serviceError(msgs[0]); err != nil {
			last = exitf(exitVerdict, "state of %s from node %s: %v", addr, n.Name, err)
			continue
		}
		var r mesh.StateReply
		if err := json.Unmarshal(msgs[0].Data, &r); err != nil {
			last = exitf(exitVerdict, "state of %s from node %s: bad answer: %v", addr, n.Name, err)
			continue
		}
		switch {
		case r.Error != "":
			last = exitf(exitVerdict, "state of %s from node %s: %s", addr, n.Name, r.Error)
			continue
		case !r.Found:
			return hub.StateRecord{}, exitf(exitVerdict, "no stored state for %s", addr)
		}
		rec := hub.StateRecord{Epoch: r.Epoch, Revision: r.Revision, Data: r.Data, Updated: r.Updated}
		if r.Owner != "" {
			if id, err := subjects.ParseNodeID(r.Owner); err == nil {
				rec.Owner = id
			}
		}
		return rec, nil
	}
	return hub.StateRecord{}, last
}

// maxValueShown is how many characters of a value the table shows.
const maxValueShown = 120

func newStateCmd(g *globals) *cobra.Command {
	state := &cobra.Command{
		Use:   "state",
		Short: "Read hubs' durable state",
	}
	state.AddCommand(&cobra.Command{
		Use:   "get ADDRESS",
		Short: "Print a hub's stored state",
		Long: `Print the durable state stored for ADDRESS (DESIGN §7a) from the state
bucket of --prefix: the node generation whose activation took it over last,
its epoch (takeovers so far), the KV revision, when it was written, its size
and its value (text, or base64 with -o json when it is not UTF-8; the table
shows at most ` + strconv.Itoa(maxValueShown) + ` characters). A node reads it for meshctl (its control
endpoint <prefix>.ctl.<node>.state), so the operator profile needs no
JetStream permission (SECURITY.md): some node of --prefix must be running.
No stored state, or no node, exits 3.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			addr := subjects.Address(args[0])
			if err := addr.Validate(); err != nil {
				return usageErrorf("invalid address: %v", err)
			}
			nc, err := g.connect("meshctl state get")
			if err != nil {
				return err
			}
			defer nc.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
			defer cancel()
			rec, err := readState(ctx, g, nc, addr)
			if err != nil {
				return err
			}
			out := stateRecord{Address: string(addr), Epoch: rec.Epoch, Revision: rec.Revision, Updated: rec.Updated.UTC(), Bytes: len(rec.Data)}
			if !rec.Owner.IsZero() {
				out.Owner = rec.Owner.String()
			}
			text := utf8.Valid(rec.Data)
			if text {
				v := string(rec.Data)
				out.Value = &v
			} else {
				out.ValueBase64 = rec.Data
			}
			if g.json() {
				if err := writeJSON(g.stdout, out); err != nil {
					return exitf(exitUsage, "write output: %v", err)
				}
				return nil
			}
			shown := "(binary)"
			if text {
				shown = printable(*out.Value, maxValueShown)
			}
			t := newTable(g.stdout, "ADDRESS", "OWNER", "EPOCH", "REVISION", "UPDATED", "BYTES", "VALUE")
			t.row(string(addr), orDash(out.Owner), out.Epoch, out.Revision, age(rec.Updated, time.Now())+" ago", out.Bytes, orDash(shown))
			if err := t.flush(); err != nil {
				return exitf(exitUsage, "write output: %v", err)
			}
			return nil
		},
	})
	return state
}

// printable shows s on one table cell: control characters as spaces, cut
// at max runes with "…".
func printable(s string, max int) string {
	r := []rune(s)
	cut := len(r) > max
	if cut {
		r = r[:max]
	}
	for i, c := range r {
		if unicode.IsControl(c) {
			r[i] = ' '
		}
	}
	if cut {
		return string(r) + "…"
	}
	return string(r)
}
