package nemesis

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// KV outputs: what a kv hub answers a set or a cas that took effect, and a
// cas whose register did not hold Expect.
const (
	KVOK   = "ok"
	KVFail = "fail"
)

// kvInput is a kv operation as the model sees it.
type kvInput struct {
	kind          OpKind
	value, expect string
}

// kvOutput is what the operation returned; known false means its outcome
// is unknown (it may or may not have taken effect).
type kvOutput struct {
	known bool
	value string // a get's value
	ok    bool   // a set's or cas's success
}

// kvModel is one register (one address): a string, "" before any set.
var kvModel = porcupine.Model{
	Init: func() any { return "" },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(string), input.(kvInput), output.(kvOutput)
		switch in.kind {
		case KVGet:
			return !out.known || out.value == s, s
		case KVSet:
			return !out.known || out.ok, in.value
		case KVCas:
			match := s == in.expect
			if out.known && out.ok != match {
				return false, s
			}
			if match {
				return true, in.value
			}
			return true, s
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(kvInput), output.(kvOutput)
		res := "?"
		if out.known {
			switch in.kind {
			case KVGet:
				res = fmt.Sprintf("%q", out.value)
			default:
				res = map[bool]string{true: KVOK, false: KVFail}[out.ok]
			}
		}
		switch in.kind {
		case KVGet:
			return "get() -> " + res
		case KVSet:
			return fmt.Sprintf("set(%q) -> %s", in.value, res)
		default:
			return fmt.Sprintf("cas(%q, %q) -> %s", in.expect, in.value, res)
		}
	},
	DescribeState: func(state any) string { return fmt.Sprintf("%q", state.(string)) },
}

// kvOperations returns, per address, the kv operations of h as Porcupine
// sees them: an Accepted operation completes at its completion time with
// its response; a resendable verdict (the callee holds nothing) leaves the
// operation out; any other verdict, or none, leaves its outcome unknown: a
// set or cas may have taken effect at any time from its call on (it stays
// pending to the end), a get says nothing and is left out.
func kvOperations(h *History) (map[string][]porcupine.Operation, int) {
	out := map[string][]porcupine.Operation{}
	n := 0
	pending := h.End // after every completion: "pending to the end"
	for _, op := range h.Ops {
		pending = max(pending, op.Complete, op.Invoke)
	}
	pending++
	for _, op := range h.Ops {
		if !op.Kind.IsKV() {
			continue
		}
		in := kvInput{kind: op.Kind, value: op.Value, expect: op.Expect}
		var res kvOutput
		ret := op.Complete
		switch {
		case op.Verdict == Accepted:
			res = kvOutput{known: true, value: op.Output, ok: op.Output == KVOK}
		case op.Resendable:
			continue
		case op.Kind == KVGet:
			continue
		default:
			ret = pending
		}
		n++
		out[op.Address] = append(out[op.Address], porcupine.Operation{
			ClientId: op.Client, Input: in, Output: res, Call: op.Invoke, Return: ret,
			Metadata: fmt.Sprintf("%s %s %s", op.ID, op.Verdict, op.Reason),
		})
	}
	return out, n
}

// CheckKV checks that the kv operations of each address are linearizable
// as one register (Porcupine): an Accepted operation took effect between
// its call and its completion and returned what the register held; one
// whose outcome is unknown may or may not have; one with a resendable
// verdict did not. For each address that is not linearizable it writes
// Porcupine's HTML visualization to o.OutDir (kv-<address>.html) and names
// the file in the violation. It judges the kv operations it fed to
// Porcupine.
func CheckKV(h *History, o Options) Finding {
	timeout := o.KVTimeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	parts, n := kvOperations(h)
	var out []Violation
	for _, addr := range sortedKeys(parts) {
		ops := parts[addr]
		res, info := porcupine.CheckOperationsVerbose(kvModel, ops, timeout)
		if res == porcupine.Ok {
			continue
		}
		detail := fmt.Sprintf("%d operations are not linearizable", len(ops))
		if res == porcupine.Unknown {
			detail = fmt.Sprintf("%d operations: linearizability undecided within %v", len(ops), timeout)
		}
		switch file, err := writeVisualization(o.OutDir, addr, info); {
		case err != nil:
			detail += fmt.Sprintf(" (visualization not written: %v)", err)
		case file != "":
			detail += "; visualization: " + file
		default:
			detail += " (no output directory for the visualization)"
		}
		out = append(out, Violation{Check: "kv-linearizable", Address: addr, Detail: detail})
	}
	return Finding{Checked: n, Violations: out}
}

func writeVisualization(dir, addr string, info porcupine.LinearizationInfo) (string, error) {
	if dir == "" {
		return "", nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	name := "kv-" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, addr) + ".html"
	path := filepath.Join(dir, name)
	if err := porcupine.VisualizePath(kvModel, info, path); err != nil {
		return "", err
	}
	return path, nil
}
