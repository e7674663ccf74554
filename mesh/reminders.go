package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/natsmesh/natsmesh/mesh/membership"
	"github.com/natsmesh/natsmesh/mesh/reminders"
	"github.com/natsmesh/natsmesh/subjects"
)

// ControlReminders is the control endpoint that sets, cancels and lists
// reminders (meshctl reminders): a ReminderRequest in, a ReminderReply out.
const ControlReminders = "reminders"

// Reminder operations of a ReminderRequest.
const (
	ReminderList   = "list"
	ReminderSet    = "set"
	ReminderCancel = "cancel"
)

// ReminderRequest is the body of a request to the reminders control
// endpoint. Op is required; Address and Name name the reminder (Address
// alone filters a list); a set takes exactly one of At, Every (a Go
// duration, at least 1 s) and Cron (with optional Zone).
type ReminderRequest struct {
	Op      string           `json:"op"`
	Address subjects.Address `json:"address,omitempty"`
	Name    string           `json:"name,omitempty"`
	At      time.Time        `json:"at,omitzero"`
	Every   string           `json:"every,omitempty"`
	Cron    string           `json:"cron,omitempty"`
	Zone    string           `json:"zone,omitempty"`
	Type    string           `json:"type,omitempty"`
	Payload []byte           `json:"payload,omitempty"`
}

// ReminderReply is the reminders control endpoint's answer: the reminders
// listed, the one set, or none for a cancel.
type ReminderReply struct {
	Node      string        `json:"node"`
	Reminders []ReminderRow `json:"reminders"`
}

// ReminderRow is one reminder as the control endpoint shows it.
type ReminderRow struct {
	Address     subjects.Address   `json:"address"`
	Name        string             `json:"name"`
	Schedule    string             `json:"schedule"`
	Type        string             `json:"type,omitempty"`
	PayloadSize int                `json:"payload_size"`
	Set         time.Time          `json:"set,omitzero"`
	Revision    uint64             `json:"revision"`
	LastFailure *reminders.Failure `json:"last_failure,omitempty"`
	// Pending is its fire not yet delivered, if any.
	Pending *reminders.PendingFire `json:"pending_fire,omitempty"`
}

func reminderRow(r reminders.Reminder) ReminderRow {
	return ReminderRow{Address: r.Address, Name: r.Name, Schedule: r.Schedule.String(), Type: r.Type,
		PayloadSize: len(r.Payload), Set: r.Set, Revision: r.Revision, LastFailure: r.LastFailure, Pending: r.Pending}
}

// Reminders returns the node's reminder store (DESIGN §13, package
// mesh/reminders): set, cancel and list reminders from anywhere, a hub's
// turn included (a factory may capture the node). It is nil before Start,
// without membership, or when MembershipConfig.DisableReminders is set.
func (n *Node) Reminders() *reminders.Store {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.rem
}

// ReminderStats returns the counters of the node's reminder runner (zero
// when it has none).
func (n *Node) ReminderStats() reminders.RunnerStats {
	n.mu.RLock()
	r := n.remRunner
	n.mu.RUnlock()
	if r == nil {
		return reminders.RunnerStats{}
	}
	return r.Stats()
}

// openReminders binds the reminders stream once, unless disabled.
func (n *Node) openReminders(ctx context.Context) error {
	mc := n.cfg.Membership
	n.mu.RLock()
	done := n.rem != nil
	n.mu.RUnlock()
	if done || mc.DisableReminders {
		return nil
	}
	replicas := mc.ReminderReplicas
	if replicas == 0 {
		replicas = mc.StateReplicas
	}
	if replicas == 0 {
		replicas = mc.Replicas
	}
	var st *reminders.Store
	err := membership.RetryEach(ctx, n.cfg.Logger, "bind the reminders stream "+reminders.StreamName(n.prefix), func(ctx context.Context) (err error) {
		st, err = reminders.Open(ctx, reminders.Config{Conn: n.conn, Prefix: n.prefix, Replicas: replicas, PlacementCluster: mc.PlacementCluster, Logger: n.cfg.Logger})
		return err
	})
	if err != nil {
		return fmt.Errorf("mesh: reminders stream: %w", err)
	}
	n.mu.Lock()
	n.rem = st
	n.mu.Unlock()
	return nil
}

// startReminders starts the node's reminder runner (once, node-wide: it
// delivers through the node's client, which outlives rejoins). Subscriber
// nodes host nothing and run none.
func (n *Node) startReminders(ctx context.Context) error {
	st := n.Reminders()
	if st == nil || n.cfg.Membership.Subscriber {
		return nil
	}
	// Each attempt bounded on its own (membership.AttemptTimeout) and
	// retried while JetStream says it is starting or electing: one request
	// lost to a stream leader that is moving would otherwise hold the
	// node's whole start budget (a soak saw a node fail to start so, after
	// a route cut had just healed).
	var r *reminders.Runner
	err := membership.RetryEach(ctx, n.cfg.Logger, "create the reminder consumer "+reminders.ConsumerName, func(ctx context.Context) (err error) {
		r, err = st.Run(ctx, reminders.RunConfig{Deliver: n.deliverFire, AckWait: n.cfg.Membership.ReminderAckWait, Clock: n.Clock()})
		return err
	})
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.remRunner = r
	n.mu.Unlock()
	return nil
}

// stopReminders stops the runner: fires under way are handed back to the
// other nodes at once.
func (n *Node) stopReminders() {
	n.mu.RLock()
	r := n.remRunner
	n.mu.RUnlock()
	if r != nil {
		r.Stop()
	}
}

// deliverFire delivers one fire as a Request through the node's client
// (placement, single activation, lanes and retries as any delivery), so it
// returns once the hub's turn handled it. The delivery is Idempotent:
// reminders are at least once, and a fire whose owner departed with it in
// hand is retried by the runner under the same ID.
func (n *Node) deliverFire(ctx context.Context, f reminders.Fire) error {
	_, err := n.Client.Request(ctx, Delivery{
		ID: f.ID, To: f.Address, Type: f.Type, Payload: f.Payload, Idempotent: true,
		reminder: f.Name, due: f.Due.UTC().Format(time.RFC3339Nano),
	})
	return err
}

// serveReminders answers the reminders control endpoint.
func (n *Node) serveReminders(data []byte) (any, error) {
	fail := func(code string, err error) error { return &controlError{code: code, err: err} }
	st := n.Reminders()
	if st == nil {
		return nil, fail("503", errors.New("this node has no reminders stream"))
	}
	var req ReminderRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return nil, fail("400", fmt.Errorf("request: %w", err))
	}
	ctx, cancel := context.WithTimeout(n.ctx, 10*time.Second)
	defer cancel()
	reply := ReminderReply{Node: n.ID().String(), Reminders: []ReminderRow{}}
	switch req.Op {
	case ReminderList:
		rs, err := st.List(ctx, req.Address)
		if err != nil {
			return nil, fail(errCode(err), err)
		}
		for _, x := range rs {
			reply.Reminders = append(reply.Reminders, reminderRow(x))
		}
	case ReminderSet:
		sch := reminders.Schedule{At: req.At, Cron: req.Cron, TimeZone: req.Zone}
		if req.Every != "" {
			d, err := time.ParseDuration(req.Every)
			if err != nil {
				return nil, fail("400", fmt.Errorf("every: %w", err))
			}
			sch.Every = d
		}
		x, err := st.Set(ctx, reminders.Reminder{Address: req.Address, Name: req.Name, Schedule: sch, Type: req.Type, Payload: req.Payload})
		if err != nil {
			return nil, fail(errCode(err), err)
		}
		reply.Reminders = append(reply.Reminders, reminderRow(x))
	case ReminderCancel:
		if err := st.Cancel(ctx, req.Address, req.Name); err != nil {
			return nil, fail(errCode(err), err)
		}
	default:
		return nil, fail("400", fmt.Errorf("op %q is not list, set or cancel", req.Op))
	}
	return reply, nil
}

func errCode(err error) string {
	switch {
	case errors.Is(err, reminders.ErrInvalidReminder):
		return "400"
	case errors.Is(err, reminders.ErrNotFound):
		return "404"
	default:
		return "500"
	}
}
