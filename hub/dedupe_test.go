package hub

import (
	"fmt"
	"testing"
)

// Records are carved from slabs (dedupe.add): across slab boundaries each
// record is its own, starts empty, and leaves the window in order; a
// forgotten ID's re-add gets a new record that forget of the old one leaves
// alone.
func TestDedupeRecordsFromSlabs(t *testing.T) {
	t.Parallel()
	const window = 3*recordSlab + 5
	d := newDedupe(window, 1<<20)
	seen := map[*record]bool{}
	for i := range 2 * window {
		id := fmt.Sprint("id-", i)
		r := d.add(id, i%2 == 0, "ans."+id)
		if seen[r] {
			t.Fatalf("record %d reused", i)
		}
		seen[r] = true
		if r.id != id || r.request != (i%2 == 0) || r.answerTo != "ans."+id || r.state != recAccepted || r.payload != nil || r.err != nil || r.alsoTo != nil {
			t.Fatalf("record %d not fresh: %+v", i, *r)
		}
		if i%7 == 0 && r.request {
			d.responded(r, []byte(id), nil)
		}
		if old := i - window; old >= 0 && d.lookup(fmt.Sprint("id-", old)) != nil {
			t.Fatalf("id-%d still in the window after %d more", old, window)
		}
		if d.lookup(id) != r {
			t.Fatalf("id-%d not found", i)
		}
	}
	r1 := d.add("again", true, "a")
	d.forget(r1)
	r2 := d.add("again", true, "b")
	d.forget(r1) // the old record: the new one stays
	if d.lookup("again") != r2 || r2 == r1 {
		t.Fatalf("forget of an old record removed the new one")
	}
}
