package membership

// Stats are counters of what the registry held that this node refused.
type Stats struct {
	// InvalidEntries counts registry entries ignored: not JSON, naming
	// another key, an invalid or absurd generation.
	InvalidEntries int64 `json:"invalid_entries"`
	// Overwritten counts times this node found its own entry overwritten
	// by another writer without a newer generation (and rewrote it).
	Overwritten int64 `json:"overwritten"`
	// WatcherRestarts counts restarts of this node's registry watcher
	// after it failed to deliver this node's own heartbeat in time (its
	// consumer was lost with a NATS server).
	WatcherRestarts int64 `json:"watcher_restarts"`
	// StaleReads counts heartbeats refused for a revision mismatch whose
	// read-back showed no newer revision than the write's: a replica that
	// lags answered (the next beat tries again); and entries of this node's
	// name that its registry watch delivered from before this generation
	// registered (a watch served by a replica that lags), not taken as the
	// loss of its registration.
	StaleReads int64 `json:"stale_reads"`
}

// Stats returns the counters. Safe for concurrent use.
func (m *Membership) Stats() Stats {
	return Stats{InvalidEntries: m.invalid.Load(), Overwritten: m.foreign.Load(), WatcherRestarts: m.rewatches.Load(), StaleReads: m.staleReads.Load()}
}
