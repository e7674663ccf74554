package membership

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/subjects"
)

// checkName refuses to go on while a live generation heartbeats under the
// name: it reads the entry and, unless it is plainly stale, watches it for up
// to one TTL for a newer heartbeat. It writes nothing.
func (m *Membership) checkName(ctx context.Context) error {
	name := m.cfg.Name
	var first Member
	var firstRev uint64
	var err error
	read := m.readEntry
	if m.cfg.nameRead != nil {
		read = m.cfg.nameRead // a test's replicas
	}
	err = Retry(ctx, func() error {
		first, firstRev, err = read(ctx, name)
		return err
	})
	if err != nil {
		return fmt.Errorf("membership: read registry: %w", err)
	}
	m.judged = first.Node
	if firstRev == 0 || first.Removed != nil {
		return nil // free, or a departed generation a survivor is removing
	}
	if !m.cfg.Rejoin.IsZero() && first.Node == m.cfg.Rejoin {
		m.cfg.Logger.Info("this process's own lost generation is still registered; superseding it", "generation", first.Node.String())
		return nil
	}
	if m.proven(first.Node) {
		m.cfg.Logger.Info("the registered generation of this node's name ran on this node's data directory, whose lock is now free: its process has exited; superseding it at once",
			"generation", first.Node.String())
		return nil
	}
	if time.Since(first.BeatAt) > m.cfg.TTL+m.cfg.Heartbeat { // real clock: BeatAt is another process's
		return nil // stale by its own clock: a crashed generation
	}
	// Real clock: this waits for another process's heartbeats, which
	// run on that process's clock.
	deadline := time.Now().Add(m.cfg.TTL)
	m.cfg.Logger.Info("a generation of this node's name is registered; waiting to see whether it still heartbeats",
		"generation", first.Node.String(), "up_to", m.cfg.TTL.String())
	// A live generation beats every heartbeat: within the TTL its beat
	// count rises again and again. A read is a direct get that any replica
	// may answer, and one behind the others shows an older beat, so that
	// reads can step back and forth between two beats written before this
	// process started watching (the 30-minute soak, round 3: a node
	// restarted after its drain's leave failed against a registry electing
	// a leader was refused its own name as "live"). So the name is live
	// only when its beat rose past the highest seen twice, or a newer
	// generation of it registered; anything older is a stale read.
	seenBeat, rises := first.Beat, 0
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(m.cfg.Heartbeat / 2):
		}
		cur, rev, err := read(ctx, name)
		switch {
		case err != nil:
			continue
		case rev == 0:
			m.judged = subjects.NodeID{}
			return nil // it left or was removed
		case cur.Removed != nil:
			m.judged = cur.Node
			return nil // judged gone by a survivor, which is removing it
		case !m.cfg.Rejoin.IsZero() && cur.Node == m.cfg.Rejoin && cur.Node.Generation > first.Node.Generation:
			// This process's own lost generation, newer than what the
			// first read showed: that read came from a replica that lags
			// (the 30-minute soak's third stop, round 3: the rejoin read
			// its own lost generation as "registered meanwhile" and stood
			// down). The write register makes is revision-checked at the
			// leader, so a newer entry than this read shows is judged
			// afresh there.
			m.cfg.Logger.Info("this process's own lost generation is registered; superseding it", "generation", cur.Node.String())
			m.judged = cur.Node
			return nil
		case cur.Node.Name == name && cur.Node.Generation > first.Node.Generation:
			return fmt.Errorf("%w: %s registered meanwhile; start with --replace to take its name over, or pick another name", ErrNameInUse, cur.Node)
		case cur.Node == first.Node && cur.Beat > seenBeat:
			seenBeat = cur.Beat
			if rises++; rises >= 2 {
				return fmt.Errorf("%w: %s is live (heartbeating); start with --replace to take its name over, or pick another name", ErrNameInUse, cur.Node)
			}
		}
	}
	return nil // silent for a TTL: gone
}

// proven reports whether node is a generation of this node's name whose
// process is proven gone (Config.Predecessors).
func (m *Membership) proven(node subjects.NodeID) bool {
	return node.Name == m.cfg.Name && node.Generation != 0 && slices.Contains(m.cfg.Predecessors, node.Generation)
}

// errRecheck: the registry entry register read is not the one checkName
// judged (another process registered in between): judge it again.
var errRecheck = errors.New("membership: the registry entry changed since it was judged")

// readEntry returns name's registry entry and revision (0 when absent).
func (m *Membership) readEntry(ctx context.Context, name string) (Member, uint64, error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	e, err := m.kv.Get(rctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Member{}, 0, nil
	}
	if err != nil {
		return Member{}, 0, err
	}
	v, _ := m.parse(e)
	return v, e.Revision(), nil
}

// AbsurdGeneration reports whether g is beyond MaxGenerationAhead of the
// local clock (2^64-1 always is).
func AbsurdGeneration(g uint64) bool {
	limit := time.Now().Add(MaxGenerationAhead).UnixNano() // real clock: generations are real times
	return limit <= 0 || g > uint64(limit)
}

// parse reads a registry entry: false (counted, logged at the first and
// every power of two) when it is not a member of its key with a valid,
// plausible generation.
func (m *Membership) parse(e jetstream.KeyValueEntry) (Member, bool) {
	var v Member
	err := json.Unmarshal(e.Value(), &v)
	switch {
	case err != nil:
	case v.Node.Name != e.Key():
		err = fmt.Errorf("entry names %q", v.Node.Name)
	case v.Node.Generation == 0 || AbsurdGeneration(v.Node.Generation):
		err = fmt.Errorf("%w: %d", ErrInvalidGeneration, v.Node.Generation)
	default:
		return v, true
	}
	if n := m.invalid.Add(1); n&(n-1) == 0 {
		m.log.Warn("registry entry ignored", "key", e.Key(), "revision", e.Revision(), "err", err, "ignored_total", n)
	}
	return Member{}, false
}

// wroteValue remembers a value about to be written for this node's entry.
// Called with wmu held.
func (m *Membership) wroteValue(b []byte) {
	m.lastN++
	m.lastWrite[m.lastN%len(m.lastWrite)] = b
}

// ownWrite reports whether the stored entry at rev is a value this node
// recently tried to write (the write whose reply was lost is not the
// latest attempt: the attempt that met the revision mismatch came after
// it); if not, it reports the overwrite (log and Stats). A read that fails
// tells nothing and reports nothing.
func (m *Membership) ownWrite(rev uint64) bool {
	ctx, cancel := context.WithTimeout(m.ctx, 2*time.Second)
	defer cancel()
	e, err := m.kv.Get(ctx, m.cfg.Name)
	if err != nil {
		return true
	}
	m.wmu.Lock()
	own := false
	for _, b := range m.lastWrite {
		own = own || b != nil && bytes.Equal(e.Value(), b)
	}
	m.wmu.Unlock()
	if own && e.Revision() == rev {
		return true
	}
	n := m.foreign.Add(1)
	m.log.Warn("own registry entry overwritten by another writer; rewriting it (SECURITY.md: give other clients no write access to the registry)",
		"revision", rev, "overwritten_total", n)
	return false
}

// register writes a new generation for the name, strictly above any
// registered one, under a revision check. BeforeAnnounce runs before each
// write with the generation about to be written.
func (m *Membership) register(ctx context.Context) error {
	name := m.cfg.Name
	const attempts = 40
	wait := 25 * time.Millisecond
	for attempt := 1; attempt <= attempts; attempt++ {
		if attempt > 1 {
			// The last write met a newer revision than the read gave:
			// another incarnation wrote meanwhile, or the read was
			// answered by a replica that lags (a KV get is a direct get,
			// which any replica serves; one just back from a partition
			// answers from before it). Back off and read again.
			select {
			case <-ctx.Done():
				return fmt.Errorf("membership: register %q: %w", name, ctx.Err())
			case <-m.cfg.Clock.After(wait):
			}
			wait = min(2*wait, time.Second)
		}
		gen := uint64(time.Now().UnixNano()) // real clock: a generation, in the registry and on the wire
		var prev, supersedes uint64
		e, err := m.kv.Get(ctx, name)
		switch {
		case err == nil:
			var raw Member
			if json.Unmarshal(e.Value(), &raw) == nil && raw.Node.Name == name && AbsurdGeneration(raw.Node.Generation) {
				return fmt.Errorf("%w: %q holds generation %d, beyond any clock (more than %v ahead): refusing to register above it; if no such node runs, delete the entry (nats kv del %s %s)",
					ErrInvalidGeneration, name, raw.Node.Generation, MaxGenerationAhead, BucketName(m.cfg.Prefix), name)
			}
			// An entry that does not parse is replaced (under the revision
			// check) by a generation from the clock.
			old, ok := m.parse(e)
			if ok && old.Node.Generation >= gen {
				gen = old.Node.Generation + 1
			}
			if ok && !m.cfg.Replace && old.Node != m.judged && old.Node != m.Self().Node {
				// Neither the entry checkName judged nor one this Join
				// wrote (an attempt whose reply was lost): another
				// process registered meanwhile.
				return errRecheck
			}
			supersedes = 0
			if ok && m.proven(old.Node) {
				supersedes = old.Node.Generation
			}
			prev = e.Revision()
		case errors.Is(err, jetstream.ErrKeyNotFound):
		default:
			return fmt.Errorf("membership: read registry: %w", err)
		}
		self := m.self
		self.Node = subjects.NodeID{Name: name, Generation: gen}
		self.Supersedes = supersedes
		self.ServerID, self.ClientID = m.connIdentity()
		if c := m.cfg.Conn.ConnectedClusterName(); c != "" {
			self.Cluster = c
		}
		self.BeatAt = time.Now().UTC() // real clock: in the registry
		m.mu.Lock()
		m.self = self
		m.mu.Unlock()
		undo := func() {}
		if f := m.cfg.BeforeAnnounce; f != nil {
			u, err := f(self.Node)
			if err != nil {
				return fmt.Errorf("membership: before announcing %s: %w", self.Node, err)
			}
			if u != nil {
				undo = u
			}
		}
		b, _ := json.Marshal(self)
		m.wmu.Lock()
		m.wroteValue(b)
		m.wmu.Unlock()
		confirmed := m.cfg.Conn.Stats().Reconnects
		start := m.cfg.Clock.Now()
		var rev uint64
		if prev == 0 {
			rev, err = m.kv.Create(ctx, name, b)
		} else {
			rev, err = m.kv.Update(ctx, name, b, prev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			undo()
			continue // raced with another incarnation: read again
		}
		if err != nil {
			undo()
			return fmt.Errorf("membership: register: %w", err)
		}
		m.mu.Lock()
		m.rev, m.confirmed = rev, confirmed
		m.mu.Unlock()
		m.joinRev.Store(rev)
		m.wroteOwn(rev, start)
		return nil
	}
	return fmt.Errorf("membership: register %q: the registry entry changed under each of %d writes (another process registering the name, or reads served by a lagging replica)", name, attempts)
}

// heartbeat refreshes the entry, every Heartbeat and at once after a
// reconnect. A revision mismatch whose stored entry is still this
// generation's (the reply of an earlier write was lost) adopts the stored
// revision; one that names no entry or another generation means the
// registration is lost.
func (m *Membership) heartbeat() {
	defer m.wg.Done()
	t := m.cfg.Clock.NewTicker(m.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-m.lost:
			return
		case <-t.Chan():
		case <-m.beatNow:
		}
		if m.pauseBeats.Load() {
			m.noteLease()
			continue
		}
		used := m.revision()
		err := m.beat()
		m.noteLease()
		switch {
		case err == nil:
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyNotFound):
			read := m.readEntry
			if f := m.mismatchRead.Load(); f != nil {
				read = *f // a test's lagging replica
			}
			cur, rev, gerr := read(m.ctx, m.cfg.Name)
			self := m.Self()
			stale := gerr == nil && rev != 0 && rev <= used
			if stale {
				// A read no newer than the refused write: a replica that
				// lags, or the stream itself lost the writes (created
				// afresh; acknowledged writes lost, Jepsen's NATS 2.12.1
				// finding). The leader tells them apart: if it holds
				// nothing newer either, its entry is the fact — else a
				// registry whose revisions fell would be taken for a
				// lagging replica at every beat, for good.
				if lcur, lrev, lerr := m.leaderEntry(m.ctx, m.cfg.Name); lerr == nil && lrev <= used {
					cur, rev, stale = lcur, lrev, false
				}
			}
			switch {
			case gerr != nil:
				// Cannot tell: try again next beat.
			case stale:
				// The write at used met a newer revision, yet the read
				// shows none newer: a read served by a replica that
				// lags (a KV get is a direct get; one just back from a
				// restart or a partition answers from before it). It
				// tells nothing: try again next beat, not at once —
				// re-adopting the stale revision and beating again at
				// once spun thousands of writes a second against a
				// stream electing its leader (the 30-minute soak,
				// round 3). Past the TTL the lease stops turns.
				m.staleReads.Add(1)
			case rev != 0 && cur.Node == self.Node && cur.Removed != nil:
				m.markLost(fmt.Sprintf("the registry says %s judged this generation gone (%s: %s)", cur.Removed.By, cur.Removed.How, cur.Removed.Reason))
				return
			case rev != 0 && (cur.Node == self.Node || !(cur.Node.Generation > self.Node.Generation && !AbsurdGeneration(cur.Node.Generation))):
				// Still this generation's (the reply of our write was
				// lost), or written by someone else without a newer
				// generation (garbage, an older or absurd generation,
				// our generation with other content): rewrite ours on
				// the stored revision.
				if m.ownWrite(rev) {
					m.log.Info("heartbeat reply was lost; the stored entry is still this generation's", "revision", rev)
				}
				m.mu.Lock()
				m.rev = rev
				m.mu.Unlock()
				select {
				case m.beatNow <- struct{}{}:
				default:
				}
			default:
				if rev != 0 && cur.Node.Generation > self.Node.Generation {
					m.supersede.Store(true)
				}
				m.markLost("heartbeat found the entry removed or superseded")
				return
			}
		default:
			if m.ctx.Err() == nil {
				m.log.Warn("heartbeat failed", "err", err)
			}
		}
	}
}

// revision is the registry revision the next heartbeat writes on.
func (m *Membership) revision() uint64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.rev
}

// beat writes one heartbeat.
func (m *Membership) beat() error {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	m.mu.RLock()
	self, rev := m.self, m.rev
	m.mu.RUnlock()
	self.Beat++
	self.BeatAt = time.Now().UTC() // real clock: in the registry
	self.ServerID, self.ClientID = m.connIdentity()
	if c := m.cfg.Conn.ConnectedClusterName(); c != "" {
		self.Cluster = c
	}
	b, _ := json.Marshal(self)
	m.wroteValue(b)
	reconnects := m.cfg.Conn.Stats().Reconnects
	ctx, cancel := context.WithTimeout(m.ctx, max(m.cfg.Heartbeat, time.Second))
	start := m.cfg.Clock.Now()
	nrev, err := m.kv.Update(ctx, self.Node.Name, b, rev)
	cancel()
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.self, m.rev, m.confirmed = self, nrev, reconnects
	m.mu.Unlock()
	m.wroteOwn(nrev, start)
	return nil
}

// SetKinds announces the hub kinds this generation hosts (kinds registered
// after it joined), so that placement can use them. It blocks on one or two
// registry round trips, bounded by ctx. An error matching [ErrLost] says
// the registry no longer names this generation (it was declared gone).
func (m *Membership) SetKinds(ctx context.Context, kinds []string) error {
	return m.updateSelf(ctx, func(self *Member) {
		self.Kinds = slices.Clone(kinds)
		slices.Sort(self.Kinds)
	})
}

// SetDraining marks this generation draining in the registry: it keeps what
// it holds but takes no new placements.
func (m *Membership) SetDraining(ctx context.Context) error {
	return m.updateSelf(ctx, func(self *Member) { self.Draining = true })
}

// updateSelf rewrites this generation's entry with change applied, under
// the revision chain the heartbeat also follows.
func (m *Membership) updateSelf(ctx context.Context, change func(*Member)) error {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	m.mu.RLock()
	self, rev := m.self, m.rev
	m.mu.RUnlock()
	change(&self)
	b, _ := json.Marshal(self)
	m.wroteValue(b)
	nrev, err := m.kv.Update(ctx, self.Node.Name, b, rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		// An earlier write's reply may have been lost: retry on the
		// stored revision if the entry is still ours.
		cur, crev, gerr := m.readEntry(ctx, self.Node.Name)
		switch {
		case gerr == nil && crev != 0 && cur.Node == self.Node && cur.Removed == nil:
			nrev, err = m.kv.Update(ctx, self.Node.Name, b, crev)
		case gerr == nil:
			// Removed, or another generation's: this one was declared
			// gone (the watcher marks it lost).
			return fmt.Errorf("%w: the registry no longer names %s: %w", ErrLost, self.Node, err)
		}
	}
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.self, m.rev = self, nrev
	m.mu.Unlock()
	return nil
}

// Leave deletes this generation's entry (a graceful departure every node
// sees at once) and stops. It is idempotent.
func (m *Membership) Leave(ctx context.Context) error {
	m.wmu.Lock()
	m.mu.RLock()
	self, rev := m.self, m.rev
	m.mu.RUnlock()
	var err error
	m.leaving.Store(true)
	select {
	case <-m.lost:
	default:
		err = m.kv.Delete(ctx, self.Node.Name, jetstream.LastRevision(rev))
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			if cur, crev, gerr := m.readEntry(ctx, self.Node.Name); gerr == nil && crev != 0 && cur.Node == self.Node {
				err = m.kv.Delete(ctx, self.Node.Name, jetstream.LastRevision(crev))
			} else {
				err = nil // already gone or superseded
			}
		}
	}
	m.wmu.Unlock()
	m.Close()
	return err
}
