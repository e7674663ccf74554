package main

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/natsmesh/natsmesh/internal/loadgen"
	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// newSendCmd builds `send` (request false) or `request` (request true).
func newSendCmd(g *globals, request bool) *cobra.Command {
	var stream, typ, id string
	var raw bool
	cmd := &cobra.Command{
		Use:   "send ADDR [DATA|-]",
		Short: "Deliver a message to an address through the ingress",
		Long: `Deliver DATA (or standard input for "-", or nothing) to the hub at ADDR
("kind/id") through the mesh ingress, and print the verdict. Accepted means
the hub holds the delivery; it is handled later.

A failure verdict exits 3; a timeout exits 4 and the mesh may still hold the
delivery: re-send it only under the same --id.`,
		Example: `  meshctl send echo/a hello
  echo '{"n":1}' | meshctl send orders/42 --stream s1 --type order.created -`,
		Args: cobra.RangeArgs(1, 2),
	}
	if request {
		cmd.Use = "request ADDR [DATA|-]"
		cmd.Short = "Send a request to an address and print the handler's response"
		cmd.Long = `Send DATA (or standard input for "-", or nothing) to the hub at ADDR
("kind/id") through the mesh ingress as a request, wait for the handler's
response and print it: its bytes exactly in table output (on a terminal a
newline is added after a response that does not end with one, unless
--raw; into a pipe or a file never), or a JSON object with -o json (payload
as a string if it is UTF-8, else payload_base64).

A failure verdict exits 3; a timeout exits 4, and the handler may or may not
have run.`
		cmd.Example = `  meshctl request echo/a hello
  meshctl request echo/a - < body.bin > answer.bin`
	}
	f := cmd.Flags()
	f.StringVar(&stream, "stream", "", "stream inside the address (ordering lane); empty is the address-wide lane")
	f.StringVar(&typ, "type", "", "delivery type (Mesh-Type header)")
	f.StringVar(&id, "id", "", "delivery ID (Mesh-Id header); empty means a fresh NUID")
	if request {
		f.BoolVar(&raw, "raw", false, "print the response's bytes exactly, with no newline added on a terminal")
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		addr, err := subjects.ParseAddress(args[0])
		if err != nil {
			return usageErrorf("invalid address %q: %v", args[0], err)
		}
		d := ingressDelivery{To: addr, Stream: subjects.Stream(stream), ID: id, Type: typ, ExpectResponse: request}
		if err := d.validate(); err != nil {
			return usageErrorf("%v", verdictMessage(err))
		}
		nc, err := g.connect("meshctl " + cmd.Name())
		if err != nil {
			return err
		}
		defer nc.Close()
		if len(args) == 2 {
			if args[1] == "-" {
				// Read at most one byte over the limit: enough to refuse.
				lim := nc.MaxPayload()
				if lim <= 0 {
					lim = 64 << 20
				}
				in := cmd.InOrStdin()
				d.Payload, err = io.ReadAll(io.LimitReader(in, lim+1))
				if err != nil {
					return usageErrorf("read standard input: %v", err)
				}
				if int64(len(d.Payload)) > lim {
					// Count the rest, to report the true size.
					rest, err := io.Copy(io.Discard, in)
					if err != nil {
						return usageErrorf("read standard input: %v", err)
					}
					return usageErrorf("payload of %d bytes is over the server's max_payload of %d bytes (delivery %s was not sent)", int64(len(d.Payload))+rest, lim, d.ID)
				}
			} else {
				d.Payload = []byte(args[1])
			}
		}
		a, err := deliverIngress(cmd.Context(), nc, g.meshPrefix(), d, g.timeout)
		if err != nil {
			return sendError(g, err, d.ID)
		}
		if a.Err != nil {
			if g.json() {
				if werr := writeJSON(g.stdout, verdictJSON(a)); werr != nil {
					return exitf(exitUsage, "write output: %v", werr)
				}
			}
			return exitf(exitVerdict, "%s", describeVerdict(a))
		}
		return printAccepted(g, a, request, raw)
	}
	return cmd
}

// sendError maps a non-verdict error of deliverIngress to its exit code.
func sendError(g *globals, err error, id string) error {
	var ve *verdict.Error
	switch {
	case errors.As(err, &ve):
		// Refused before sending: invalid input or too large a payload.
		return usageErrorf("%s", verdictMessage(err))
	case errors.Is(err, errNoIngress):
		return exitf(exitVerdict, "%v on prefix %s: is a node running? (delivery %s was not sent)", err, g.prefix, id)
	case errors.Is(err, errIngressTimeout):
		return exitf(exitTimeout, "no answer in %v for delivery %s: outcome unknown, the mesh may hold it; do not re-send it blindly (a re-send with --id %s may be deduped)", g.timeout, id, id)
	}
	return natsError(err, "deliver %s", id)
}

// verdictMessage is err's message without the verdict name.
func verdictMessage(err error) string {
	var ve *verdict.Error
	if errors.As(err, &ve) && ve.Message != "" {
		return ve.Message
	}
	return err.Error()
}

// describeVerdict is the one-line description of a failure verdict: its
// name, reason, message, node, and whether it is safe to re-send.
func describeVerdict(a ingressAnswer) string {
	s := verdict.Classify(a.Err).String()
	if r := verdict.ReasonOf(a.Err); r != verdict.ReasonUnknown {
		s += " (" + r.String() + ")"
	}
	msg := verdictMessage(a.Err)
	s += ": " + msg
	if a.Node != "" && !strings.Contains(msg, a.Node) {
		s += " [node " + a.Node + "]"
	}
	s += fmt.Sprintf(" [id %s]", a.ID)
	switch {
	case errors.Is(a.Err, verdict.ErrNoPlacement):
		s += "; nothing was placed or sent: check the kind, or start a node that hosts it (safe to re-send)"
	case verdict.IsResendable(a.Err):
		s += "; the mesh holds nothing: safe to re-send"
	}
	return s
}

type verdictOut struct {
	Verdict       string  `json:"verdict"`
	Reason        string  `json:"reason,omitempty"`
	Message       string  `json:"message,omitempty"`
	Resendable    *bool   `json:"resendable,omitempty"`
	Node          string  `json:"node,omitempty"`
	ID            string  `json:"id"`
	Payload       *string `json:"payload,omitempty"`
	PayloadBase64 *string `json:"payload_base64,omitempty"`
}

func verdictJSON(a ingressAnswer) verdictOut {
	v := verdictOut{Verdict: verdict.Classify(a.Err).String(), Node: a.Node, ID: a.ID}
	if a.Err != nil {
		if r := verdict.ReasonOf(a.Err); r != verdict.ReasonUnknown {
			v.Reason = r.String()
		}
		v.Message = verdictMessage(a.Err)
		res := verdict.IsResendable(a.Err)
		v.Resendable = &res
	}
	return v
}

func printAccepted(g *globals, a ingressAnswer, request, raw bool) error {
	var err error
	switch {
	case g.json():
		v := verdictJSON(a)
		if request {
			if utf8.Valid(a.Payload) {
				s := string(a.Payload)
				v.Payload = &s
			} else {
				s := base64.StdEncoding.EncodeToString(a.Payload)
				v.PayloadBase64 = &s
			}
		}
		err = writeJSON(g.stdout, v)
	case request:
		// The response byte for byte; on a terminal, unless --raw, ended
		// by a newline so that the prompt starts on its own line.
		_, err = g.stdout.Write(a.Payload)
		if err == nil && !raw && loadgen.IsTerminal(g.stdout) && (len(a.Payload) == 0 || a.Payload[len(a.Payload)-1] != '\n') {
			_, err = g.stdout.Write([]byte{'\n'})
		}
	default:
		node := a.Node
		if node == "" {
			node = "the mesh"
		}
		_, err = fmt.Fprintf(g.stdout, "Accepted by %s (id %s)\n", node, a.ID)
	}
	if err != nil {
		return exitf(exitUsage, "write output: %v", err)
	}
	return nil
}
