package hub

// ReadOnly is implemented by hubs whose kind marks some delivery types as
// read-only (DESIGN §13): turns of those types only read the hub, so one
// activation may run several of them at once — never beside an exclusive
// turn (any other type), and never beside one another past
// [MaxReadOnlyTurns]. ReadOnlyTypes is called once, on the build's
// goroutine, when the activation is built.
//
// Order: the inbox stays in acceptance order, and an exclusive delivery
// runs only after every delivery accepted before it finished and before any
// accepted after it starts, so a stream's exclusive deliveries keep their
// order and a read sees every write accepted before it. Read-only
// deliveries accepted back to back may run in any order among themselves.
// A read-only handler must not change what an exclusive turn reads (nor
// save durable state) without its own synchronisation.
type ReadOnly interface {
	Hub
	ReadOnlyTypes() []string
}

// MaxReadOnlyTurns bounds the read-only turns one activation runs at once.
const MaxReadOnlyTurns = 64

// readOnlyLocked reports whether e is read-only for this activation.
// Called with a.mu held.
func (a *activation) readOnlyLocked(e *entry) bool {
	return a.readOnly != nil && a.readOnly[e.Type]
}

// readTurns runs the read-only deliveries at the head of the inbox
// concurrently, admitting more while the head stays read-only (each time
// one finishes), and returns once none runs and the head is exclusive, the
// inbox empty or the activation no longer ready. Called on the turn
// goroutine.
func (a *activation) readTurns(hub Hub) {
	done := make(chan struct{}, MaxReadOnlyTurns)
	running := 0
	for {
		for running < MaxReadOnlyTurns {
			a.mu.Lock()
			if a.state != stateReady || a.head == len(a.queue) || !a.readOnlyLocked(a.queue[a.head]) {
				a.mu.Unlock()
				break
			}
			e := a.queue[a.head]
			a.queue[a.head] = nil
			a.head++
			a.mu.Unlock()
			running++
			go func() {
				defer func() { done <- struct{}{} }()
				a.turn(hub, e)
			}()
		}
		if running == 0 {
			return
		}
		<-done
		running--
	}
}

// turn runs one delivery taken from the inbox, unless the host no longer
// serves or a failure already settled it.
func (a *activation) turn(hub Hub, e *entry) {
	gated := a.host.cfg.Clock.Now()
	if err := a.host.serving(); err != nil {
		// Fenced while it waited (e.g. the process was frozen and
		// declared gone): another node may own the address now, so
		// handling it here could run it out of order or twice.
		a.host.fail(e, err)
		return
	}
	if !e.taken.CompareAndSwap(false, true) {
		return // already failed (closing)
	}
	a.handle(hub, e, gated)
}
