package hub

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// Durable hub state (DESIGN §7a). A hub that keeps state beyond its
// activation calls [LoadState] from its [Factory]: the activation takes the
// address's stored state over (a compare-and-set write naming this node
// generation and a bumped epoch) before it serves, and every later
// [State.Save] is a compare-and-set on the revision it last wrote. So an
// activation that lost its address (superseded, frozen past detection, its
// claim rewritten) can never overwrite its successor: the successor's
// takeover moved the revision on, the stale save fails with
// [ErrStateFenced] before anything is written, and the stale activation
// stands down — it accepts nothing more, and what it still had queued fails
// late with a resendable not-the-owner verdict. The fence is on the data
// itself, not only on a local flag: it holds even when the stale node does
// not yet know it lost its claim.
//
// The host does not know how state is stored: it declares [StateStore],
// which the node wires to a JetStream KV bucket (package mesh/hubstate).

// DefaultStateTimeout bounds a state load or save whose ctx has no deadline.
const DefaultStateTimeout = 5 * time.Second

// StateRecord is one stored state: the hub's bytes with the identity of
// the activation that took it over last.
type StateRecord struct {
	// Owner is the node generation whose activation took the state over
	// last.
	Owner subjects.NodeID
	// Epoch counts takeovers: each activation's takeover writes the
	// previous epoch + 1, so it is strictly increasing across the
	// address's activations (1 for the first).
	Epoch uint64
	// Revision is the store's revision of this record (0: never stored).
	Revision uint64
	// Data is the hub's state (nil when nothing was saved yet).
	Data []byte
	// Updated is when the store wrote the record (zero if unknown).
	Updated time.Time
}

// StateStore keeps hubs' state, one record per address. Implementations
// must be safe for concurrent use, and every write must be a
// compare-and-set on the revision the caller read, acknowledged only once
// stored at the store's replication.
type StateStore interface {
	// Take takes addr's state over for owner: it reads the record and
	// rewrites it naming owner and the next epoch, under compare-and-set
	// (retrying if another writer moved it meanwhile). It returns the
	// record as written.
	Take(ctx context.Context, addr subjects.Address, owner subjects.NodeID) (StateRecord, error)
	// Save replaces prev (the caller's latest record of addr) with data,
	// keeping prev's owner and epoch, under compare-and-set on
	// prev.Revision, and returns the record as written. Errors:
	// [ErrStateTooLarge] (nothing written), [ErrStateFenced] (the record
	// moved on: nothing written), [ErrStateUnavailable] (the store could
	// not be reached and nothing was written), [ErrStateUnknown] (the
	// store could not say whether it was written).
	Save(ctx context.Context, addr subjects.Address, prev StateRecord, data []byte) (StateRecord, error)
	// Delete removes addr's stored record under compare-and-set on
	// prev.Revision, so that readers find no state and the next takeover
	// starts from no data with an epoch still above every earlier one. It
	// returns prev's owner and epoch with no data and the deletion's
	// revision (a later Save compares on it). Errors as Save's.
	Delete(ctx context.Context, addr subjects.Address, prev StateRecord) (StateRecord, error)
	// MaxValueSize is the largest data a Save takes, in bytes.
	MaxValueSize() int
}

// State is one activation's handle on its address's durable state, from
// [LoadState]. Data and the record's fields reflect the last successful
// load or save. Safe for concurrent use; saves are serialised.
type State struct {
	a     *activation
	store StateStore

	mu   sync.Mutex
	rec  StateRecord
	lost error // non-nil once the activation stood down for its state
}

type activationKey struct{}

// LoadState takes over the stored state of the address being built and
// returns its handle. Call it from a [Factory], with the ctx the factory
// received (it carries the activation); a second call in the same build
// returns the same handle. It blocks until the takeover is stored, at most
// until ctx ends (DefaultStateTimeout if ctx has no deadline). Errors:
// [ErrNoStateStore] when the host has no state store (for instance a
// standalone node without JetStream) or ctx is not a factory's; otherwise
// the store's error, which fails the build.
func LoadState(ctx context.Context) (*State, error) {
	a, _ := ctx.Value(activationKey{}).(*activation)
	if a == nil {
		return nil, fmt.Errorf("%w: LoadState outside a hub factory", ErrNoStateStore)
	}
	store := a.host.cfg.State
	if store == nil {
		return nil, fmt.Errorf("%w: node %s keeps no durable state", ErrNoStateStore, a.host.nodeID)
	}
	a.mu.Lock()
	s := a.stateHandle
	a.mu.Unlock()
	if s != nil {
		return s, nil
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	rec, err := store.Take(ctx, a.addr, a.host.cfg.Node)
	if err != nil {
		return nil, fmt.Errorf("hub: take over the state of %s: %w", a.addr, err)
	}
	s = &State{a: a, store: store, rec: rec}
	a.mu.Lock()
	a.stateHandle = s
	a.mu.Unlock()
	return s, nil
}

func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, DefaultStateTimeout)
}

// Data returns the state as last loaded or saved (nil if none was ever
// saved). The slice must not be modified.
func (s *State) Data() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec.Data
}

// Record returns the last loaded or saved record.
func (s *State) Record() StateRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec
}

// Epoch returns this activation's takeover epoch (strictly increasing
// across the address's activations).
func (s *State) Epoch() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec.Epoch
}

// MaxSize is the largest data Save takes, in bytes.
func (s *State) MaxSize() int { return s.store.MaxValueSize() }

// Save stores data as the address's state under compare-and-set on the
// revision this activation last wrote, and returns once the store
// acknowledged it at its replication. It blocks at most until ctx ends
// (DefaultStateTimeout if ctx has no deadline). Errors:
//   - [ErrStateTooLarge]: data is over MaxSize; nothing was written, the
//     activation goes on.
//   - [ErrStateUnavailable]: the store could not be reached and nothing
//     was written; the activation goes on.
//   - [ErrStateFenced]: another activation took the state over (or this
//     one stood down earlier); nothing was written. The activation stands
//     down: it accepts nothing more, what it had queued fails late with a
//     resendable not-the-owner verdict, and a request whose handler returns
//     this error is answered not-the-owner (nothing persisted: resendable).
//   - [ErrStateUnknown]: the store could not say whether data was written;
//     the activation stands down (it no longer knows its revision), and a
//     request whose handler returns this error is answered outcome-unknown
//     (verdict.ErrOutcomeUnknown) and its delivery ID forgotten, so that
//     its re-send reaches the activation that takes the state over.
func (s *State) Save(ctx context.Context, data []byte) error {
	if max := s.store.MaxValueSize(); len(data) > max {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrStateTooLarge, len(data), max)
	}
	return s.write(ctx, func(ctx context.Context, prev StateRecord) (StateRecord, error) {
		return s.store.Save(ctx, s.a.addr, prev, data)
	}, "save")
}

// write runs one compare-and-set write of the record (a save or a
// delete), serialised with the others, and stands the activation down
// when it was fenced or its outcome is unknown.
func (s *State) write(ctx context.Context, op func(context.Context, StateRecord) (StateRecord, error), what string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost != nil {
		return s.lost
	}
	if s.a.isClosed() {
		// Stood down already (claim lost, host closing): a successor may
		// be taking the state over right now.
		s.lost = fmt.Errorf("%w: activation of %s on %s stood down", ErrStateFenced, s.a.addr, s.a.host.nodeID)
		return s.lost
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	rec, err := op(ctx, s.rec)
	switch {
	case err == nil:
		s.rec = rec
		return nil
	case errors.Is(err, ErrStateFenced), errors.Is(err, ErrStateUnknown):
		s.lost = fmt.Errorf("hub: %s state of %s on %s: %w", what, s.a.addr, s.a.host.nodeID, err)
		s.a.standDown(s.lost)
		return s.lost
	default:
		return fmt.Errorf("hub: %s state of %s: %w", what, s.a.addr, err)
	}
}

// Delete removes the address's stored state (a hub that is done with
// it: nothing of it is read again) under compare-and-set on the revision
// this activation last wrote, and returns once the store acknowledged it.
// Afterwards Data is nil; the activation goes on and may Save again, and
// the next activation starts with no data (an epoch still above every
// earlier one). It blocks at most until ctx ends (DefaultStateTimeout if
// ctx has no deadline). Errors as Save's: [ErrStateUnavailable] (nothing
// deleted; the activation goes on), [ErrStateFenced] and [ErrStateUnknown]
// (the activation stands down).
func (s *State) Delete(ctx context.Context) error {
	return s.write(ctx, func(ctx context.Context, prev StateRecord) (StateRecord, error) {
		return s.store.Delete(ctx, s.a.addr, prev)
	}, "delete")
}

// stateVerdict maps a handler's state error to the verdict its requester
// gets, or nil for other errors: nothing persisted because the activation
// was fenced is resendable (not the owner: re-resolve); nothing persisted
// because the store was unreachable is resendable (the store is down); a
// save the store could not settle is outcome-unknown (it may have been
// stored: the caller reconciles, for instance by re-sending the same
// delivery ID, which the intake then does not answer from its dedupe
// window but hands to whichever activation holds the state now).
func stateVerdict(err error, node string) *verdict.Error {
	switch {
	case errors.Is(err, ErrStateFenced):
		return &verdict.Error{Reason: verdict.ReasonNotOwner, Message: "state not saved", Node: node, Err: err}
	case errors.Is(err, ErrStateUnavailable):
		return &verdict.Error{Reason: verdict.ReasonDirectoryDown, Message: "state not saved", Node: node, Err: err}
	case errors.Is(err, ErrStateUnknown):
		return &verdict.Error{Reason: verdict.ReasonOutcomeUnknown, Message: "state save outcome unknown", Node: node, Err: err}
	}
	return nil
}
