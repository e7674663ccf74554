package main

import (
	"context"
	"errors"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/natsmesh/natsmesh/mesh/hubstate"
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
shows at most ` + strconv.Itoa(maxValueShown) + ` characters). It reads the bucket directly: no node needs
to be running. No stored state (or no state bucket) exits 3.`,
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
			js, err := jetstream.New(nc)
			if err != nil {
				return natsError(err, "jetstream")
			}
			bucket := hubstate.BucketName(g.meshPrefix())
			kv, err := js.KeyValue(ctx, bucket)
			if errors.Is(err, jetstream.ErrBucketNotFound) {
				return exitf(exitVerdict, "no stored state for %s: the mesh has no state bucket %s", addr, bucket)
			}
			if err != nil {
				return natsError(err, "bind state bucket %s", bucket)
			}
			rec, err := hubstate.Read(ctx, kv, addr)
			if errors.Is(err, hubstate.ErrNotFound) {
				return exitf(exitVerdict, "no stored state for %s", addr)
			}
			if errors.Is(err, hubstate.ErrCorrupt) {
				return exitf(exitVerdict, "%v", err)
			}
			if err != nil {
				return natsError(err, "read state of %s", addr)
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
