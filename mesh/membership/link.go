package membership

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
)

// connIdentity returns the server ID and client ID of the connection now.
func (m *Membership) connIdentity() (string, uint64) {
	cid, _ := m.cfg.Conn.GetClientID()
	return m.cfg.Conn.ConnectedServerId(), cid
}

// Lost is closed when this node's registration was removed or superseded:
// it was declared gone and must stop serving (fencing). After a removal it
// may rejoin with a new generation; after a supersession (Superseded) another
// live incarnation holds the name and this one must not rejoin.
func (m *Membership) Lost() <-chan struct{} { return m.lost }

// IsLost reports whether the registration was lost (Lost is closed).
func (m *Membership) IsLost() bool {
	select {
	case <-m.lost:
		return true
	default:
		return false
	}
}

// Superseded reports whether the registration was lost to a newer
// generation of the same name.
func (m *Membership) Superseded() bool { return m.supersede.Load() }

// Confirmed reports whether this node may start turns now: its link is up,
// its registration was confirmed by a heartbeat on the connection as it is
// now, and it holds its registration lease (LeaseLapsed). It is false from
// the moment the link drops until the first good heartbeat after the
// reconnect, while heartbeats have gone unacknowledged for a TTL with other
// members' taken (its server cut off from the registry), and for good once
// lost (self-fencing).
func (m *Membership) Confirmed() bool {
	select {
	case <-m.lost:
		return false
	default:
	}
	if m.cfg.Conn.Status() != nats.CONNECTED {
		return false
	}
	if !m.leaseHeld() {
		return false
	}
	m.mu.RLock()
	c := m.confirmed
	m.mu.RUnlock()
	return c == m.cfg.Conn.Stats().Reconnects
}

// WaitConfirmed blocks until the registration is confirmed on the current
// connection (nil), it is lost (ErrLost), or ctx ends (ctx's error). A node
// pauses handling while unconfirmed after a reconnect instead of failing
// what it holds.
func (m *Membership) WaitConfirmed(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond) // real clock: a poll for a condition, bounded by ctx
	defer t.Stop()
	for {
		select {
		case <-m.lost:
			return ErrLost
		default:
		}
		if m.Confirmed() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.lost:
			return ErrLost
		case <-t.C:
		}
	}
}

// linkEvents asks for a heartbeat at once when the link comes back, so the
// registration is confirmed (and turns resume) without waiting a period.
func (m *Membership) linkEvents() {
	defer m.wg.Done()
	for {
		select {
		case <-m.ctx.Done():
			return
		case s, ok := <-m.status:
			if !ok {
				return
			}
			if s == nats.CONNECTED {
				m.announceMoved()
				select {
				case m.beatNow <- struct{}{}:
				default:
				}
			}
		}
	}
}

func (m *Membership) markLost(why string) {
	m.lostOnce.Do(func() {
		m.log.Warn("registration lost: this generation must stop serving", "why", why)
		close(m.lost)
	})
}
