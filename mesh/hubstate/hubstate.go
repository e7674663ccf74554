// Package hubstate keeps hubs' durable state (DESIGN §7a) in a JetStream KV
// bucket: one key per address (the address's subject token), file storage,
// replicated as configured (three replicas on a three-server cluster). It
// implements hub.StateStore.
//
// Every write is a compare-and-set on the revision the writer read
// (jetstream.KeyValue.Create for an absent key, Update otherwise), and
// returns once the bucket's stream acknowledged it — that is, once a quorum
// of its replicas stored it. What "stored" means on disk is the server's
// sync setting (docs/operations.md, "Durable hub state").
//
// A record is a small binary envelope in front of the hub's bytes:
//
//	byte 0      format version (1)
//	uvarint     epoch: takeovers so far
//	uvarint n   then n bytes: the owner node generation, "name.gen"
//	rest        the hub's data
//
// A takeover writes the owner and epoch+1 under compare-and-set, so every
// write of the previous activation, which compares against a revision the
// takeover moved on, fails: the fence is on the data.
package hubstate

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/internal/clock"
	"github.com/natsmesh/natsmesh/internal/plant"
	"github.com/natsmesh/natsmesh/subjects"
)

// DefaultMaxValueSize is the largest hub state a save takes when Config
// gives none: 1 MiB less 4 KiB, so that a record fits a default
// max_payload (1 MiB) with its envelope and the publish's headers.
const DefaultMaxValueSize = 1<<20 - 4<<10

// envelopeMax is the most an envelope adds to the hub's data: the version
// byte, an epoch (10 bytes), and an owner of up to 64+1+20 bytes with its
// length.
const envelopeMax = 1 + binary.MaxVarintLen64 + 1 + 85

// payloadSlack is what a publish's headers may take beside the value
// (Nats-Expected-Last-Subject-Sequence and the like).
const payloadSlack = 1024

const formatV1 = 1

var (
	// ErrInvalidConfig: a required Config field is missing or invalid.
	ErrInvalidConfig = errors.New("hubstate: invalid config")
	// ErrNotFound: the address has no stored state.
	ErrNotFound = errors.New("hubstate: no stored state")
	// ErrCorrupt: a stored value is not a state record.
	ErrCorrupt = errors.New("hubstate: corrupt record")
)

// Config holds the store's settings. Conn is required; zero fields take
// their documented defaults.
type Config struct {
	// Conn is the NATS connection of the node.
	Conn *nats.Conn
	// Prefix names the bucket (BucketName); zero means
	// subjects.DefaultPrefix.
	Prefix subjects.Prefix
	// Replicas of the bucket, used when this node creates it; zero means
	// 1. Use 3 on a three-server cluster. An existing bucket keeps its
	// own (Open logs a warning when they differ; Store.Replicas says).
	Replicas int
	// PlacementCluster places a bucket this node creates in that NATS
	// cluster (DESIGN §12); empty: the server's default.
	PlacementCluster string
	// MaxValueSize is the largest hub state a save takes, in bytes; zero
	// means DefaultMaxValueSize. It is lowered to what fits the
	// server's max_payload, and to an existing bucket's limit.
	MaxValueSize int
	// MemoryStorage keeps the bucket in memory instead of files (tests
	// and benchmarks only: state then does not survive the NATS servers).
	MemoryStorage bool
	// Logger receives the warning that an existing bucket's replicas
	// differ from Replicas; nil means slog.Default().
	Logger *slog.Logger
	// Clock times the pauses between retries of a read or a write (50 ms
	// each, bounded by the operation's ctx); nil means the real clock.
	Clock clock.Clock
}

// BucketName returns the state bucket of a prefix.
func BucketName(p subjects.Prefix) string {
	if p == "" {
		p = subjects.DefaultPrefix
	}
	return "natsmesh_" + strings.ReplaceAll(string(p), ".", "_") + "_state"
}

// Key returns the bucket key of an address.
func Key(addr subjects.Address) string { return subjects.EncodeToken(string(addr)) }

// Store is a handle on the state bucket. Safe for concurrent use.
type Store struct {
	kv       jetstream.KeyValue
	js       jetstream.JetStream
	stream   jetstream.Stream // the bucket's stream, for raw reads of deletion markers
	name     string           // the bucket's stream
	api      string           // the JetStream API prefix, "$JS.API."
	pre      string           // the bucket's subject prefix, "$KV.<bucket>."
	max      int
	replicas int
	clock    clock.Clock
}

var _ hub.StateStore = (*Store)(nil)

// Open binds the state bucket, creating it if absent (file storage, history
// 1, Config.Replicas). It blocks until the bucket is bound or ctx ends.
// Errors match ErrInvalidConfig, or are JetStream's.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Conn == nil {
		return nil, fmt.Errorf("%w: Conn is nil", ErrInvalidConfig)
	}
	if cfg.Replicas < 0 || cfg.MaxValueSize < 0 {
		return nil, fmt.Errorf("%w: negative Replicas or MaxValueSize", ErrInvalidConfig)
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	limit := cfg.MaxValueSize
	if limit == 0 {
		limit = DefaultMaxValueSize
	}
	if mp := int(cfg.Conn.MaxPayload()) - payloadSlack - envelopeMax; mp > 0 && limit > mp {
		limit = mp
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, err
	}
	storage := jetstream.FileStorage
	if cfg.MemoryStorage {
		storage = jetstream.MemoryStorage
	}
	kcfg := jetstream.KeyValueConfig{
		Bucket:       BucketName(cfg.Prefix),
		Description:  "natsmesh durable hub state",
		Placement:    placement(cfg.PlacementCluster),
		Storage:      storage,
		Replicas:     cfg.Replicas,
		History:      1,
		MaxValueSize: int32(limit + envelopeMax),
	}
	kv, err := js.KeyValue(ctx, kcfg.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, kcfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, kcfg.Bucket) // created concurrently
		}
	}
	if err != nil {
		return nil, fmt.Errorf("hubstate: bucket %s: %w", kcfg.Bucket, err)
	}
	replicas := cfg.Replicas
	if st, err := kv.Status(ctx); err == nil {
		if kst, ok := st.(*jetstream.KeyValueBucketStatus); ok {
			sc := kst.StreamInfo().Config
			if bm := int(sc.MaxMsgSize); bm > 0 && bm-envelopeMax < limit {
				limit = bm - envelopeMax
			}
			replicas = sc.Replicas
		}
	}
	if replicas != cfg.Replicas {
		// Not reconfigured here: a node's permissions do not include
		// stream updates (docs/operations.md), and a replica change moves
		// the state's durability, which is the operator's decision.
		log := cfg.Logger
		if log == nil {
			log = slog.Default()
		}
		log.Warn("the durable state bucket keeps its existing replica count, not this node's; reconfigure it with an administrative client if intended",
			"bucket", kcfg.Bucket, "bucket_replicas", replicas, "configured_replicas", cfg.Replicas,
			"command", fmt.Sprintf("nats stream edit KV_%s --replicas %d", kcfg.Bucket, cfg.Replicas))
	}
	if limit <= 0 {
		return nil, fmt.Errorf("%w: bucket %s takes no value of any size", ErrInvalidConfig, kcfg.Bucket)
	}
	stream, err := js.Stream(ctx, "KV_"+kcfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("hubstate: bucket %s: %w", kcfg.Bucket, err)
	}
	return &Store{kv: kv, js: js, stream: stream, name: stream.CachedInfo().Config.Name, api: apiPrefix(js), pre: "$KV." + kcfg.Bucket + ".", max: limit, replicas: replicas, clock: clock.Or(cfg.Clock)}, nil
}

// Replicas returns the bucket's replica count as the server reported it
// when the store was opened (Config.Replicas if it could not say).
func (s *Store) Replicas() int { return s.replicas }

// MaxValueSize is the largest hub state a save takes, in bytes
// (hub.StateStore).
func (s *Store) MaxValueSize() int { return s.max }

// Encode returns the stored form of a record (its Revision and Updated are
// not stored).
func Encode(r hub.StateRecord) []byte {
	owner := ""
	if !r.Owner.IsZero() {
		owner = r.Owner.String()
	}
	b := make([]byte, 0, envelopeMax+len(r.Data))
	b = append(b, formatV1)
	b = binary.AppendUvarint(b, r.Epoch)
	b = binary.AppendUvarint(b, uint64(len(owner)))
	b = append(b, owner...)
	return append(b, r.Data...)
}

// Decode reads a stored value back into a record's Owner, Epoch and Data.
// Errors match ErrCorrupt.
func Decode(v []byte) (hub.StateRecord, error) {
	var r hub.StateRecord
	if len(v) == 0 || v[0] != formatV1 {
		return r, fmt.Errorf("%w: unknown format", ErrCorrupt)
	}
	rest := v[1:]
	epoch, n := binary.Uvarint(rest)
	if n <= 0 {
		return r, fmt.Errorf("%w: epoch", ErrCorrupt)
	}
	rest = rest[n:]
	ol, n := binary.Uvarint(rest)
	if n <= 0 || ol > uint64(len(rest)-n) {
		return r, fmt.Errorf("%w: owner", ErrCorrupt)
	}
	rest = rest[n:]
	if ol > 0 {
		id, err := subjects.ParseNodeID(string(rest[:ol]))
		if err != nil {
			return r, fmt.Errorf("%w: owner: %w", ErrCorrupt, err)
		}
		r.Owner = id
	}
	r.Epoch = epoch
	if d := rest[ol:]; len(d) > 0 {
		r.Data = d
	}
	return r, nil
}

// Take takes addr's state over for owner (hub.StateStore): it writes the
// record back naming owner and the next epoch, under compare-and-set,
// retrying until it wins or ctx ends. A record that does not decode fails
// the take (ErrCorrupt) rather than being overwritten.
func (s *Store) Take(ctx context.Context, addr subjects.Address, owner subjects.NodeID) (hub.StateRecord, error) {
	key := Key(addr)
	var last error
	var deletedAt uint64 // the revision of the key's deletion marker, once met
	for {
		if err := ctx.Err(); err != nil {
			if last != nil {
				return hub.StateRecord{}, fmt.Errorf("%w (last: %w)", err, last)
			}
			return hub.StateRecord{}, err
		}
		cur := hub.StateRecord{}
		e, err := s.kv.Get(ctx, key)
		absent := errors.Is(err, jetstream.ErrKeyNotFound)
		switch {
		case absent:
			// Never stored, or deleted: a deletion's marker (found below
			// when the write meets it) is the last message, and its
			// revision — above every revision, hence every epoch, the key
			// had — is the floor of the next epoch, which so stays strictly
			// increasing across deletions.
			cur.Revision, cur.Epoch = deletedAt, deletedAt
		case err != nil:
			last = err
			s.pause(ctx)
			continue
		default:
			if r, derr := Decode(e.Value()); derr == nil {
				cur = r
			} else {
				return hub.StateRecord{}, fmt.Errorf("state of %s: %w", addr, derr)
			}
			cur.Revision = e.Revision()
		}
		next := hub.StateRecord{Owner: owner, Epoch: cur.Epoch + 1, Data: cur.Data}
		// Revision 0 writes only if the subject has no message at all (not
		// even a deletion's marker, unlike KeyValue.Create).
		rev, err := s.kv.Update(ctx, key, Encode(next), cur.Revision)
		if err != nil {
			last = err // moved meanwhile, or unreachable: read again
			if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) {
				s.pause(ctx)
			} else if absent {
				deletedAt = s.deletedAt(ctx, key)
			}
			continue
		}
		next.Revision = rev
		return next, nil
	}
}

// Save replaces prev with data under compare-and-set on prev.Revision
// (hub.StateStore). A save whose outcome the reply does not settle (a
// timeout, a dropped link) is resolved by reading the record back: a newer
// revision of this owner's epoch holding data is this save (an activation
// saves one at a time); anything else leaves the outcome unknown
// (hub.ErrStateUnknown) — a record another activation took over does not
// say whether this save landed before the takeover (the taker then read
// it and carries it on), and the bucket keeps one revision per key. A
// revision mismatch is read back too (mismatched): it is fenced only when
// the record moved on without this save.
func (s *Store) Save(ctx context.Context, addr subjects.Address, prev hub.StateRecord, data []byte) (hub.StateRecord, error) {
	if len(data) > s.max {
		return hub.StateRecord{}, fmt.Errorf("%w: %d bytes, the limit is %d", hub.ErrStateTooLarge, len(data), s.max)
	}
	if prev.Revision == 0 {
		return hub.StateRecord{}, fmt.Errorf("%w: no record taken over", hub.ErrStateFenced)
	}
	next := hub.StateRecord{Owner: prev.Owner, Epoch: prev.Epoch, Data: data}
	if plant.On(plant.AckUnsaved) {
		next.Revision = prev.Revision
		return next, nil
	}
	rev, err := s.kv.Update(ctx, Key(addr), Encode(next), prev.Revision)
	if err == nil {
		next.Revision = rev
		return next, nil
	}
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return s.mismatched(ctx, addr, prev, next, err)
	}
	if notWritten(err) {
		return hub.StateRecord{}, fmt.Errorf("%w: %w", hub.ErrStateUnavailable, err)
	}
	// Unsettled: read it back, on a fresh bound (ctx may be what ended).
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), hub.DefaultStateTimeout)
	defer cancel()
	for rctx.Err() == nil {
		cur, gerr := s.readBack(rctx, addr)
		if gerr != nil {
			break // gone, corrupt, or no answer within the bound: unknown
		}
		switch {
		case cur.Revision == prev.Revision:
			// Not applied yet; it may still be (a proposal in flight),
			// so this is not "not written".
		case cur.Revision < prev.Revision:
			// A stale read (a replica that still believes it leads):
			// says nothing.
			s.pause(rctx)
			continue
		case cur.Epoch == prev.Epoch && cur.Owner == prev.Owner && bytes.Equal(cur.Data, data):
			return cur, nil // this save landed
		default:
			// Moved on: by a takeover that may have read this save (found
			// by the nemesis: a save across a cut gateway landed, its
			// reply was lost, the successor's take carried its data on —
			// and "fenced, nothing written" made the request resendable).
			return hub.StateRecord{}, fmt.Errorf("%w: %w; revision %d of %s was since replaced by epoch %d of %s, which may have taken this save over",
				hub.ErrStateUnknown, err, prev.Revision, addr, cur.Epoch, cur.Owner)
		}
		break
	}
	return hub.StateRecord{}, fmt.Errorf("%w: %w", hub.ErrStateUnknown, err)
}

// mismatched settles a save the bucket refused with a revision mismatch
// ("wrong last sequence"). That does not prove nothing was written: the
// refused publish may repeat one that was stored (found by
// TestLeaseServerPartition: as an isolated server's routes came back, a
// save was refused "wrong last sequence" while its own value was the
// record, and the next get served it — answered not-the-owner, i.e.
// resendable, it was a lost update). So the record is read back from the
// leader: this owner's epoch holding this data at a newer revision is this
// save (an activation saves one at a time); the record still at prev's
// revision (a write in flight: the server refuses a second meanwhile), or
// at an older one (a stale read), or gone, or another epoch holding this
// data leaves it unknown; another epoch holding other data is fenced —
// the record moved on without this save. A read that fails leaves it
// unknown. Not told apart (the bucket keeps one revision per key): a
// successor that carried this save on and saved again before the read.
func (s *Store) mismatched(ctx context.Context, addr subjects.Address, prev, next hub.StateRecord, err error) (hub.StateRecord, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), hub.DefaultStateTimeout)
	defer cancel()
	cur, gerr := s.readBack(rctx, addr)
	unknown := func(why string, a ...any) (hub.StateRecord, error) {
		return hub.StateRecord{}, fmt.Errorf("%w: %w; revision %d of %s: %s", hub.ErrStateUnknown, err, prev.Revision, addr, fmt.Sprintf(why, a...))
	}
	switch {
	case gerr != nil:
		return unknown("read back: %v", gerr)
	case cur.Revision <= prev.Revision:
		return unknown("the record read back is at revision %d (a write in flight, or a stale read)", cur.Revision)
	case bytes.Equal(cur.Data, next.Data):
		if cur.Epoch == prev.Epoch && cur.Owner == prev.Owner {
			return cur, nil // a repeat of this save, which landed
		}
		return unknown("replaced by epoch %d of %s holding this save's data, which may have taken it over", cur.Epoch, cur.Owner)
	case cur.Epoch == prev.Epoch && cur.Owner == prev.Owner:
		return unknown("this epoch's record holds other data at revision %d", cur.Revision)
	}
	return hub.StateRecord{}, fmt.Errorf("%w: revision %d of %s is no longer current: %w", hub.ErrStateFenced, prev.Revision, addr, err)
}

// deletedAt returns the revision of key's deletion marker if the key's
// last message is one, else 0.
func (s *Store) deletedAt(ctx context.Context, key string) uint64 {
	m, err := s.stream.GetLastMsgForSubject(ctx, s.pre+key)
	if err != nil {
		return 0
	}
	switch m.Header.Get(kvOperation) {
	case kvDelete, kvPurge:
		return m.Sequence
	}
	return 0
}

// The KV operation header of a deletion marker (as jetstream.KeyValue
// writes and reads it).
const (
	kvOperation = "KV-Operation"
	kvDelete    = "DEL"
	kvPurge     = "PURGE"
)

// Delete removes addr's record (hub.StateStore) under compare-and-set on
// prev.Revision: it writes the bucket's deletion marker, so readers find
// no state (ErrNotFound) and the next takeover starts from empty data with
// an epoch above every earlier one. The record returned keeps prev's owner
// and epoch, with no data and the marker's revision, on which the same
// activation may save again. Errors as Save's: hub.ErrStateFenced (the
// record moved on: nothing deleted), hub.ErrStateUnavailable (nothing
// deleted), hub.ErrStateUnknown (the reply did not settle it).
func (s *Store) Delete(ctx context.Context, addr subjects.Address, prev hub.StateRecord) (hub.StateRecord, error) {
	if prev.Revision == 0 {
		return hub.StateRecord{}, fmt.Errorf("%w: no record taken over", hub.ErrStateFenced)
	}
	m := nats.NewMsg(s.pre + Key(addr))
	m.Header.Set(kvOperation, kvDelete)
	ack, err := s.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(prev.Revision))
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
		return hub.StateRecord{Owner: prev.Owner, Epoch: prev.Epoch, Revision: ack.Sequence}, nil
	case errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant):
		// As a save's (mismatched): fenced only when the leader shows
		// another epoch's record; a marker (this delete, repeated), the
		// record still at prev's revision or older, or a failed read
		// leave it unknown.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), hub.DefaultStateTimeout)
		defer cancel()
		cur, gerr := s.leaderGet(rctx, addr)
		if gerr == nil && cur.Revision > prev.Revision && (cur.Epoch != prev.Epoch || cur.Owner != prev.Owner) {
			return hub.StateRecord{}, fmt.Errorf("%w: revision %d of %s is no longer current: %w", hub.ErrStateFenced, prev.Revision, addr, err)
		}
		return hub.StateRecord{}, fmt.Errorf("%w: %w; revision %d of %s read back at revision %d (%v)", hub.ErrStateUnknown, err, prev.Revision, addr, cur.Revision, gerr)
	case notWritten(err):
		return hub.StateRecord{}, fmt.Errorf("%w: %w", hub.ErrStateUnavailable, err)
	}
	return hub.StateRecord{}, fmt.Errorf("%w: %w", hub.ErrStateUnknown, err)
}

// notWritten reports whether err proves the write was not stored: no
// stream took the publish, or the server answered with an API error.
func notWritten(err error) bool {
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrMaxPayload) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr)
}

// pause waits a little before another attempt, or until ctx ends.
func (s *Store) pause(ctx context.Context) {
	t := s.clock.NewTimer(50 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.Chan():
	}
}

// apiPrefix returns the JetStream API prefix js sends its requests under.
func apiPrefix(js jetstream.JetStream) string {
	o := js.Options()
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}

// placement returns the JetStream placement in cluster, nil when empty.
func placement(cluster string) *jetstream.Placement {
	if cluster == "" {
		return nil
	}
	return &jetstream.Placement{Cluster: cluster}
}
