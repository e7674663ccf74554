package directory

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/subjects"
)

// verifier keeps this node's claims true (DESIGN §5–§6) at a cost that does
// not grow with their number:
//
//   - a watch of the directory's changes (updates only, metadata only): a
//     change to a key this node holds, at a revision it did not write (an
//     overwrite, a delete), is checked at once — re-created if gone,
//     stood down if another generation holds it;
//   - each interval, one stream info: a directory stream created anew (the
//     soft state was lost) or whose last sequence fell below the newest
//     revision this node holds (acknowledged writes lost, Jepsen's NATS
//     2.12.1 finding), or a watch that had to be started again (it may
//     have missed changes), makes the next pass a full one — every claim
//     re-read in batches (verify);
//   - otherwise each interval re-reads one batch of claims in rotation
//     (sweep), a backstop whose cost per interval is constant: every
//     address held is re-read within two rounds, 2 × ceil(claims /
//     VerifyBatch) intervals (one claimed just after a round began waits
//     for the next).
func (d *Directory) verifier() {
	defer d.wg.Done()
	t := d.cfg.Clock.NewTicker(d.cfg.VerifyInterval)
	defer t.Stop()
	var w jetstream.KeyWatcher
	var updates <-chan jetstream.KeyValueEntry
	defer func() {
		if w != nil {
			// Not waited for: nats.go drops the subscription at once,
			// then asks JetStream to delete the consumer, which waits out
			// the JetStream API timeout (5 s) when the server is
			// unreachable — Close (and Drain) sat out those 5 s with NATS
			// down (TestDrainBoundNATSUnreachable's cleanup). The
			// consumer is ephemeral: the server removes it without us.
			go func() { _ = w.Stop() }()
		}
	}()
	full := false
	for {
		if w == nil && !d.cfg.noWatch {
			var err error
			if w, err = d.kv.WatchAll(d.ctx, jetstream.UpdatesOnly(), jetstream.MetaOnly()); err == nil {
				updates = w.Updates()
				full = d.Owned() > 0 // changes made while no watch ran were missed
			} else {
				w, updates = nil, nil
				d.watchFailures.Add(1)
			}
		}
		select {
		case <-d.ctx.Done():
			return
		case e, ok := <-updates:
			if !ok {
				go func(w jetstream.KeyWatcher) { _ = w.Stop() }(w) // as above
				w, updates = nil, nil
				continue
			}
			if e != nil {
				d.changed(e)
			}
		case <-d.departure:
			d.pruneDead()
			continue
		case <-t.Chan():
			if d.streamChanged() {
				full = true
			}
			if full {
				d.verify()
				full = false
				d.fullPasses.Add(1)
			} else {
				d.sweep()
			}
		}
	}
}

// changed checks a directory change the watch delivered, if it is to a
// key this node holds at a revision other than the one it wrote.
func (d *Directory) changed(e jetstream.KeyValueEntry) {
	a, err := subjects.DecodeToken(e.Key())
	if err != nil {
		return
	}
	addr := subjects.Address(a)
	d.mu.Lock()
	h, ok := d.owned[addr]
	d.mu.Unlock()
	if !ok || h.rev == e.Revision() && e.Operation() == jetstream.KeyValuePut {
		return // not ours, or our own write
	}
	d.watchChecks.Add(1)
	ctx, cancel := context.WithTimeout(d.ctx, ReadTimeout)
	defer cancel()
	c, cur, err := d.read(ctx, addr)
	if err != nil {
		return // cannot tell: the sweep looks again
	}
	d.check(ctx, ownedClaim{addr, h.id, h.rev}, c, cur)
}

// streamChanged reports whether the directory's stream was created anew or
// lost writes this node holds claims at (its last sequence is below the
// newest revision held), since the last look. A stream that cannot be read
// reports no change (looked at again next interval).
func (d *Directory) streamChanged() bool {
	// The newest revision before the stream is read: claims written
	// meanwhile are beyond what the answer can show.
	d.mu.Lock()
	newest := d.newest
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(d.ctx, ReadTimeout)
	defer cancel()
	st, err := d.kv.Status(ctx)
	if err != nil {
		return false
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok || bs.StreamInfo() == nil {
		return false
	}
	info := bs.StreamInfo()
	d.mu.Lock()
	defer d.mu.Unlock()
	created := info.Created
	changed := !d.streamCreated.IsZero() && !created.Equal(d.streamCreated)
	d.streamCreated = created
	if changed {
		d.newest = 0 // a new stream numbers from 1 again; the full pass re-writes
	}
	return changed || info.State.LastSeq < newest
}

// sweep re-reads the next VerifyBatch claims of the current round, in
// revision order (the verifier's constant-cost backstop). A round is the
// claims held when it began, sorted by revision: taking that snapshot is
// the one scan of the claims held in memory, once per round —
// ceil(claims / VerifyBatch) intervals — so an interval costs O(VerifyBatch
// × log claims), not a scan of every claim (a scan per interval was a
// quarter of a node's CPU at rest holding 333 000). An address is swept
// with whatever claim it holds when its turn comes; one claimed after a
// round began is swept in the next round, one released meanwhile is
// skipped.
func (d *Directory) sweep() {
	k := d.cfg.VerifyBatch
	d.mu.Lock()
	if len(d.sweepRound) == 0 {
		round := make([]ownedClaim, 0, len(d.owned))
		for a, o := range d.owned {
			round = append(round, ownedClaim{a, o.id, o.rev})
		}
		d.mu.Unlock()
		slices.SortFunc(round, func(a, b ownedClaim) int { return cmp.Compare(a.rev, b.rev) })
		d.mu.Lock()
		d.sweepRound = round
	}
	batch := make([]ownedClaim, 0, min(k, len(d.sweepRound)))
	for len(d.sweepRound) > 0 && len(batch) < k {
		c := d.sweepRound[0]
		d.sweepRound[0] = ownedClaim{}
		d.sweepRound = d.sweepRound[1:]
		// By address, with the claim held now: an address re-claimed since
		// the round began (collected and activated again, a new claim each
		// time) is still swept — matched by its old claim it would be
		// skipped every round, for good (found in review).
		if o, ok := d.owned[c.addr]; ok {
			batch = append(batch, ownedClaim{c.addr, o.id, o.rev})
		}
	}
	if len(d.sweepRound) == 0 {
		d.sweepRound = nil // the next sweep starts a round: free this one's array
	}
	d.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	d.swept.Add(int64(len(batch)))
	d.sweeps.Add(1)
	ctx, cancel := context.WithTimeout(d.ctx, ReadTimeout)
	d.verifyBatch(ctx, batch)
	cancel()
}

// cacheSet caches owner as addr's. Past CacheSize entries it evicts: the
// entries of generations no longer alive, then arbitrary ones down to
// seven eighths of the size, so a pass is not run per entry. The cache may
// pass its size by the number of goroutines storing at once.
func (d *Directory) cacheSet(addr subjects.Address, owner subjects.NodeID) {
	if _, loaded := d.cache.Swap(addr, owner); !loaded {
		d.cacheAdded(addr)
	}
}

// cacheAdded counts a new cache entry for addr and keeps the bound
// (cacheSet).
func (d *Directory) cacheAdded(addr subjects.Address) {
	if d.cacheLen.Add(1) <= int64(d.cfg.CacheSize) || !d.evicting.CompareAndSwap(false, true) {
		return
	}
	defer d.evicting.Store(false)
	d.pruneDead()
	floor := int64(d.cfg.CacheSize - d.cfg.CacheSize/8)
	d.cache.Range(func(k, v any) bool {
		if d.cacheLen.Load() <= floor {
			return false
		}
		if k.(subjects.Address) != addr {
			d.cacheDrop(k.(subjects.Address), v.(subjects.NodeID))
		}
		return true
	})
}

// cacheDrop drops addr's cached owner if it is node.
func (d *Directory) cacheDrop(addr subjects.Address, node subjects.NodeID) {
	if d.cache.CompareAndDelete(addr, node) {
		d.cacheLen.Add(-1)
	}
}

// pruneDead drops the cached owners that are no live generation (a
// departure was seen): a sender's cache holds no generation after it is
// gone, whether or not its addresses are resolved again.
func (d *Directory) pruneDead() {
	d.cache.Range(func(k, v any) bool {
		if n := v.(subjects.NodeID); !d.members.Alive(n) {
			d.cacheDrop(k.(subjects.Address), n)
		}
		return true
	})
}

// ownedClaim is one claim this node holds, as the verifier read it: its
// address, identity and the revision it wrote.
type ownedClaim struct {
	addr subjects.Address
	id   uint64
	rev  uint64
}

// verify re-reads every claim this node holds, VerifyBatch of them per
// request in the order they were written, and acts on what it finds
// (check). A batch that cannot be read is looked at again next period.
func (d *Directory) verify() {
	d.mu.Lock()
	owned := make([]ownedClaim, 0, len(d.owned))
	for a, h := range d.owned {
		owned = append(owned, ownedClaim{a, h.id, h.rev})
	}
	d.mu.Unlock()
	slices.SortFunc(owned, func(a, b ownedClaim) int { return cmp.Compare(a.rev, b.rev) })
	for len(owned) > 0 && d.ctx.Err() == nil {
		batch := owned[:min(len(owned), d.cfg.VerifyBatch)]
		owned = owned[len(batch):]
		ctx, cancel := context.WithTimeout(d.ctx, ReadTimeout)
		d.verifyBatch(ctx, batch)
		cancel()
	}
}

// verifyBatch reads batch's claims in one batched direct get (or one at a
// time where the server has none) and checks each.
func (d *Directory) verifyBatch(ctx context.Context, batch []ownedClaim) {
	if !d.cfg.perKey {
		found, err := d.lastOf(ctx, batch)
		switch {
		case err == nil:
			mine := d.ownPrefix()
			for i, o := range batch {
				e := found[i]
				if e.rev == o.rev && bytes.HasPrefix(e.value, mine) {
					continue // still ours, as written
				}
				var c Claim
				if e.rev != 0 {
					c = d.parse(o.addr, e.rev, e.value)
				}
				d.check(ctx, o, c, e.rev)
			}
			return
		case !errors.Is(err, errNoBatchRead):
			return // cannot tell: keep serving, look again next period
		}
	}
	for _, o := range batch {
		c, cur, err := d.read(ctx, o.addr)
		if err != nil {
			continue // cannot tell: keep serving, look again next period
		}
		d.check(ctx, o, c, cur)
	}
}

// ownPrefix is how this node's claims begin as written (json.Marshal of a
// Claim: its owner first): an entry still at the revision this node wrote
// that begins so is its claim, read without decoding it.
func (d *Directory) ownPrefix() []byte {
	b, _ := json.Marshal(Claim{Owner: d.self()})
	if i := bytes.Index(b, []byte(`,"claimed"`)); i > 0 {
		return b[:i]
	}
	return b // cannot happen: decode every entry
}

// errNoBatchRead: the server does not answer batched direct gets (older
// than 2.11, or a bucket without direct gets): read one claim at a time.
var errNoBatchRead = errors.New("directory: no batched direct get")

// lastEntry is the last entry of one key (rev 0: absent or deleted).
type lastEntry struct {
	rev      uint64
	value    []byte
	answered bool // the server named the key (a delete marker has rev 0)
}

// lastOf reads the last entry of each claim's key in batch with JetStream's
// batched direct get ({"multi_last":[subjects...],"batch":n} on
// $JS.API.DIRECT.GET.<stream>): one message per key that has an entry (its
// subject in Nats-Subject, revision in Nats-Sequence), in sequence order,
// then "204 EOB" with Nats-Num-Pending (what the server held back, e.g. for
// max_bytes: asked for again); "404 No Results" when no key has one. The
// result is indexed like batch; a key the answer does not name is absent.
func (d *Directory) lastOf(ctx context.Context, batch []ownedClaim) ([]lastEntry, error) {
	out := make([]lastEntry, len(batch))
	idx := make(map[string]int, len(batch))
	want := make([]string, 0, len(batch))
	for i, o := range batch {
		subj := d.bucketSubj + key(o.addr)
		idx[subj] = i
		want = append(want, subj)
	}
	nc := d.cfg.Conn
	for len(want) > 0 {
		body, err := json.Marshal(struct {
			MultiLast []string `json:"multi_last"`
			Batch     int      `json:"batch"`
			MaxBytes  int      `json:"max_bytes,omitempty"`
		}{want, len(want), d.maxBytes})
		if err != nil {
			return nil, err
		}
		inbox := nc.NewRespInbox()
		sub, err := nc.SubscribeSync(inbox)
		if err != nil {
			return nil, err
		}
		seen, pending, err := d.readBatch(ctx, sub, inbox, body, idx, out)
		_ = sub.Unsubscribe()
		if err != nil {
			return nil, err
		}
		if pending == 0 {
			return out, nil
		}
		if seen == 0 {
			return nil, fmt.Errorf("directory: batched read returned nothing with %d pending", pending)
		}
		// Held back: ask again for the keys the answer did not name.
		d.heldBack.Add(1)
		rest := want[:0]
		for _, subj := range want {
			if !out[idx[subj]].answered {
				rest = append(rest, subj)
			}
		}
		want = rest
	}
	return out, nil
}

// readBatch sends one batched direct get and reads its answer into out. It
// returns how many entries it read and the server's Nats-Num-Pending.
func (d *Directory) readBatch(ctx context.Context, sub *nats.Subscription, inbox string, body []byte, idx map[string]int, out []lastEntry) (seen int, pending uint64, err error) {
	if err := d.cfg.Conn.PublishRequest(d.directGet, inbox, body); err != nil {
		return 0, 0, err
	}
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return seen, 0, err
		}
		switch st := m.Header.Get("Status"); st {
		case "":
		case "204": // end of batch
			np, err := strconv.ParseUint(m.Header.Get(numPendingHeader), 10, 64)
			if err != nil {
				return seen, 0, fmt.Errorf("directory: batched read: end of batch with Nats-Num-Pending %q", m.Header.Get(numPendingHeader))
			}
			return seen, np, nil
		case "404":
			if seen == 0 && m.Header.Get("Description") == "No Results" {
				return 0, 0, nil // no key has an entry
			}
			return seen, 0, fmt.Errorf("directory: batched read: %s %s", st, m.Header.Get("Description"))
		case "408", "503":
			// Bad request (a server without multi_last) or no responders
			// (no direct gets on this stream).
			return seen, 0, fmt.Errorf("%w: %s %s", errNoBatchRead, st, m.Header.Get("Description"))
		default:
			return seen, 0, fmt.Errorf("directory: batched read: %s %s", st, m.Header.Get("Description"))
		}
		i, ok := idx[m.Header.Get(jetstream.SubjectHeader)]
		if !ok {
			return seen, 0, fmt.Errorf("directory: batched read: answer for %q, not asked for", m.Header.Get(jetstream.SubjectHeader))
		}
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil || seq == 0 {
			return seen, 0, fmt.Errorf("directory: batched read: Nats-Sequence %q", m.Header.Get(jetstream.SequenceHeader))
		}
		seen++
		switch m.Header.Get(kvOperationHeader) {
		case "DEL", "PURGE":
			out[i] = lastEntry{answered: true} // deleted: absent
		default:
			out[i] = lastEntry{rev: seq, value: m.Data, answered: true}
		}
	}
}

// Headers of a batched direct get that nats.go names only unexported:
// kvOperationHeader marks a KV delete or purge entry, numPendingHeader
// counts what the server still holds back.
const (
	kvOperationHeader = "KV-Operation"
	numPendingHeader  = "Nats-Num-Pending"
)

// check acts on what the verifier read of one of its claims: cur is the
// key's revision now (0: absent) and c its claim. A claim that is gone is
// re-created, one owned by another generation makes this node stand down
// (OnLost), one overwritten by something that is no claim is re-written.
func (d *Directory) check(ctx context.Context, o ownedClaim, c Claim, cur uint64) {
	addr, rev := o.addr, o.rev
	self := d.self()
	switch {
	case cur == rev && c.Owner == self:
		// Still ours.
	case cur != 0 && cur < rev:
		// Older than the claim itself: a replica that lags answered
		// (direct gets are served by any replica; a server just back
		// from a partition answers from before it). A key's revisions
		// only grow, so nothing written after our claim can read
		// older: nothing to judge; the next round reads again. Before,
		// such a read showed the address's previous owner and made the
		// live owner stand down.
		d.staleReads.Add(1)
	case cur == 0:
		// Lost (e.g. the bucket was lost): re-claim.
		b, _ := json.Marshal(Claim{Owner: self, Claimed: time.Now().UTC()}) // real clock: written to the bucket
		if nrev, err := d.kv.Create(ctx, key(addr), b); err == nil {
			if !d.rewrote(o, nrev) {
				// Released meanwhile: the entry just written is
				// nobody's; take it back.
				_ = d.remove(ctx, addr, nrev)
			}
		} else if errors.Is(err, jetstream.ErrKeyExists) {
			// The key has an entry after all: the read was stale (on a
			// replicated bucket a replica that lags answers direct gets
			// too) or someone wrote it since. Judge by what it holds;
			// a read that still finds nothing cannot tell.
			if c, cur, err := d.read(ctx, addr); err == nil && cur != 0 {
				d.check(ctx, o, c, cur)
			}
		}
	case c.Owner == self:
		// Ours at another revision: a newer claim of this node
		// (whose token is checked on its own), or an entry re-written
		// for this one. Keep following it only while this claim is
		// still the address's current one.
		d.rewrote(o, cur)
	case c.Owner.IsZero():
		// Overwritten by something that is no claim at all (it does
		// not parse): report it and re-write ours.
		n := d.foreign.Add(1)
		d.log.Warn("own claim overwritten by an unreadable entry; re-writing it (SECURITY.md: give other clients no write access to the directory)",
			"address", string(addr), "revision", cur, "overwritten_total", n)
		b, _ := json.Marshal(Claim{Owner: self, Claimed: time.Now().UTC()}) // real clock: written to the bucket
		if nrev, err := d.kv.Update(ctx, key(addr), b, cur); err == nil {
			if !d.rewrote(o, nrev) {
				_ = d.remove(ctx, addr, nrev)
			}
		}
	case !d.members.Alive(c.Owner):
		// A claim of a generation this node does not see alive: an
		// unknown writer, or a node it has not seen join yet. Standing
		// down is the safe side (two activations never serve).
		n := d.foreign.Add(1)
		d.log.Warn("own claim overwritten naming a generation that is not live; standing down", "address", string(addr), "claimed_by", c.Owner.String(), "overwritten_total", n)
		d.standDown(o, "claim overwritten by "+c.Owner.String())
	default:
		d.standDown(o, "claim overwritten by "+c.Owner.String())
	}
}

// rewrote records that o's claim is now at revision rev, if o is still the
// address's current claim on this node; it reports whether it was.
func (d *Directory) rewrote(o ownedClaim, rev uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	h, ok := d.owned[o.addr]
	if !ok || h.id != o.id {
		return false
	}
	d.owned[o.addr] = held{id: o.id, rev: rev}
	d.newest = max(d.newest, rev)
	return true
}

// standDown gives up o's claim and tells OnLost to stand down the
// activation holding it, if o is still the address's current claim on this
// node (a newer claim of the address is verified on its own).
func (d *Directory) standDown(o ownedClaim, why string) {
	d.mu.Lock()
	h, ok := d.owned[o.addr]
	if !ok || h.id != o.id {
		d.mu.Unlock()
		return
	}
	delete(d.owned, o.addr)
	d.mu.Unlock()
	d.cacheDrop(o.addr, d.self())
	d.log.Warn("claim lost: standing down", "address", string(o.addr), "why", why)
	if f := d.cfg.OnLost; f != nil {
		f(hub.ClaimToken{Addr: o.addr, ID: o.id, Rev: o.rev})
	}
}
