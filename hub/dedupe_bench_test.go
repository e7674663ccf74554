package hub

import (
	"strconv"
	"testing"
)

// BenchmarkDedupeKey is what keying dedupe per caller (DESIGN §5, §10:
// (caller identity, delivery ID)) costs the intake per delivery against
// keying it by the ID alone: the key's construction, then the lookup and
// the insert the intake makes for every delivery, in a full window
// (DefaultDedupeWindow, so every insert also evicts). IDs are 22
// characters (a NUID), the caller a request-info identity of typical
// length. BENCHMARKS.md sets the difference against an ingress delivery's
// whole cost in the same run.
func BenchmarkDedupeKey(b *testing.B) {
	ids := make([]string, 1<<17)
	for i := range ids {
		ids[i] = "5ZcmyQ0EbDXZ" + strconv.FormatInt(int64(1e9+i), 36)
	}
	const caller = "acct:TENANT_A/user:alice"
	for _, bc := range []struct {
		name   string
		caller string
	}{{"id", ""}, {"caller+id", caller}} {
		b.Run(bc.name, func(b *testing.B) {
			d := newDedupe(DefaultDedupeWindow, DefaultDedupeResponseBytes)
			for i := range DefaultDedupeWindow { // a full window
				d.add(dedupeKey(bc.caller, ids[i%len(ids)]), false, "")
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				k := dedupeKey(bc.caller, ids[(i+DefaultDedupeWindow)%len(ids)])
				if d.lookup(k) == nil {
					d.add(k, false, "")
				}
			}
		})
	}
}
