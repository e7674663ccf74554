package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/natsmesh/natsmesh/subjects"
)

// The data directory's files (docs/operations.md, "Restarts"): LockFile is
// held with an exclusive OS lock (flock) for as long as the process runs —
// the kernel releases it when the process exits, however it exits — and
// HolderFile records the node name and the generations the holders
// announced, so that the next process that takes the lock knows which
// generations are dead.
const (
	LockFile   = "meshd.lock"
	HolderFile = "meshd.node"
)

// ErrDataDirInUse: another process holds the data directory's lock.
var ErrDataDirInUse = errors.New("daemon: data directory in use")

// maxRecorded bounds the generations a holder record keeps (the newest):
// a start or a rejoin announces one, or a few when its registration races.
const maxRecorded = 16

// holderRecord is HolderFile's content.
type holderRecord struct {
	Name   string `json:"name"`
	Prefix string `json:"prefix"`
	// BootID is the kernel's boot ID when the record was written: the
	// lock proves a holder gone only on the kernel that held it (a data
	// directory on a volume that moved to another machine proves
	// nothing about a process still running on the first).
	BootID string `json:"boot_id,omitempty"`
	PID    int    `json:"pid"`
	// Generations the processes holding the directory announced (or were
	// about to announce), oldest first.
	Generations []uint64  `json:"generations"`
	Updated     time.Time `json:"updated"`
	// Exit is how the holder's run ended, written just before it let the
	// lock go: ExitDrained, or the error its run returned (a drain cut
	// short by its deadline, a newer incarnation taking over, …). Empty
	// while it runs, and after a process that was killed or crashed —
	// which is how meshd drain tells a clean drain from the rest.
	Exit string `json:"exit,omitempty"`
}

// ExitDrained is the holder record's Exit after a clean run: the node
// drained and left.
const ExitDrained = "drained"

// ErrDrainNotClean: the holder exited, but not after a clean drain (its
// drain was cut short, it failed, or it was killed).
var ErrDrainNotClean = errors.New("daemon: the holder exited without a clean drain")

// dataDir is a data directory held by this process.
type dataDir struct {
	dir  string
	lock *os.File
	log  *slog.Logger

	mu  sync.Mutex
	rec holderRecord
	// predecessors are the generations of this node's name recorded by
	// processes that held the directory on this kernel: holding the lock
	// proves them exited.
	predecessors []uint64
}

// bootIDFile holds the Linux kernel's boot ID; elsewhere there is none and
// no predecessor is ever proven gone.
var bootIDFile = "/proc/sys/kernel/random/boot_id"

func bootID() string {
	b, err := os.ReadFile(bootIDFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// openDataDir creates dir if needed, takes its lock (ErrDataDirInUse,
// naming the holder, when another process has it), reads what the previous
// holders recorded and records this process as the holder.
func openDataDir(dir, name string, prefix subjects.Prefix, log *slog.Logger) (*dataDir, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("daemon: data dir: %w", err)
	}
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("daemon: lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, inUse(dir)
		}
		return nil, fmt.Errorf("daemon: lock %s: %w", path, err)
	}
	d := &dataDir{dir: dir, lock: f, log: log}
	boot := bootID()
	prev, ok := readHolder(dir)
	switch {
	case !ok || len(prev.Generations) == 0:
	case prev.Name != name || prev.Prefix != string(prefix):
		log.Info("the data directory was held by another node name or prefix; its generations are not this node's to supersede",
			"dir", dir, "recorded_name", prev.Name, "recorded_prefix", prev.Prefix)
	case boot == "" || prev.BootID != boot:
		log.Info("the data directory's previous holder ran under another kernel boot (or none is known here): its lock proves nothing about it, so a registered generation is judged by its heartbeat",
			"dir", dir, "recorded_generations", len(prev.Generations))
	default:
		d.predecessors = slices.Clone(prev.Generations)
	}
	d.rec = holderRecord{Name: name, Prefix: string(prefix), BootID: boot, PID: os.Getpid(), Generations: slices.Clone(d.predecessors)}
	if err := d.writeLocked(); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// readHolder reads dir's holder record.
func readHolder(dir string) (holderRecord, bool) {
	var r holderRecord
	b, err := os.ReadFile(filepath.Join(dir, HolderFile))
	if err != nil || json.Unmarshal(b, &r) != nil {
		return holderRecord{}, false
	}
	return r, true
}

// Predecessors returns the generations of this node's name whose processes
// are proven gone (mesh.MembershipConfig.Predecessors).
func (d *dataDir) Predecessors() []uint64 { return slices.Clone(d.predecessors) }

// Record durably records id's generation before it is announced
// (mesh.MembershipConfig.OnGeneration): should this process die, the next
// holder of the directory knows that generation is gone.
func (d *dataDir) Record(id subjects.NodeID) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !slices.Contains(d.rec.Generations, id.Generation) {
		d.rec.Generations = append(d.rec.Generations, id.Generation)
		if n := len(d.rec.Generations); n > maxRecorded {
			d.rec.Generations = slices.Clone(d.rec.Generations[n-maxRecorded:])
		}
	}
	return d.writeLocked()
}

// writeLocked replaces HolderFile atomically and durably (a temporary file,
// fsync, rename, fsync of the directory). Called with mu held (or before d
// is shared).
func (d *dataDir) writeLocked() error {
	d.rec.Updated = time.Now().UTC()
	b, _ := json.Marshal(d.rec)
	path := filepath.Join(d.dir, HolderFile)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("daemon: data dir: record the holder: %w", err)
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		if df, derr := os.Open(d.dir); derr == nil {
			err = df.Sync()
			df.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("daemon: data dir: record the holder: %w", err)
	}
	return nil
}

// RecordExit records how this run ended (nil: drained) in the holder
// record, for meshd drain; a failure to write it is logged.
func (d *dataDir) RecordExit(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rec.Exit = ExitDrained
	if err != nil {
		d.rec.Exit = err.Error()
	}
	if werr := d.writeLocked(); werr != nil {
		d.log.Warn("could not record how the run ended", "err", werr)
	}
}

// Close releases the lock. The record stays: the next holder reads it.
func (d *dataDir) Close() error { return d.lock.Close() }

// ErrNoHolder: no process holds the data directory (nothing to drain).
var ErrNoHolder = errors.New("daemon: no meshd holds the data directory")

// DrainHolder asks the meshd holding dir to drain, as SIGTERM does (meshd
// drain, a Kubernetes preStop hook): it sends SIGTERM to the pid the
// holder recorded and waits until the holder has exited — its lock is free
// — or ctx ends. It returns the holder's pid; ErrNoHolder if no process
// holds the lock (none runs); ctx's error if the holder is still running
// when ctx ends. The lock is what it trusts: a recorded pid is signalled
// only while the directory is locked.
func DrainHolder(ctx context.Context, dir string) (int, error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("%w: %s has no %s", ErrNoHolder, dir, LockFile)
	}
	if err != nil {
		return 0, fmt.Errorf("daemon: lock %s: %w", path, err)
	}
	defer f.Close()
	free := func() bool {
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			return false
		}
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		return true
	}
	if free() {
		return 0, fmt.Errorf("%w: %s is not locked", ErrNoHolder, dir)
	}
	rec, ok := readHolder(dir)
	if !ok || rec.PID <= 0 {
		return 0, fmt.Errorf("daemon: %s is locked but records no holder pid", dir)
	}
	if err := syscall.Kill(rec.PID, syscall.SIGTERM); err != nil {
		return rec.PID, fmt.Errorf("daemon: signal the holder of %s (pid %d): %w", dir, rec.PID, err)
	}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !free() {
		select {
		case <-ctx.Done():
			return rec.PID, fmt.Errorf("daemon: the holder of %s (pid %d) is still draining: %w", dir, rec.PID, ctx.Err())
		case <-t.C:
		}
	}
	// Exited: how? The record says, if the holder wrote it on its way
	// out; a process killed or crashed (a second signal included) wrote
	// nothing.
	end, ok := readHolder(dir)
	switch {
	case !ok || end.PID != rec.PID || end.Exit == "":
		return rec.PID, fmt.Errorf("%w: pid %d exited without recording how its run ended (killed or crashed?); see its log", ErrDrainNotClean, rec.PID)
	case end.Exit != ExitDrained:
		return rec.PID, fmt.Errorf("%w: pid %d: %s", ErrDrainNotClean, rec.PID, end.Exit)
	}
	return rec.PID, nil
}

// CheckDataDir reports whether another process holds dir's lock: the same
// ErrDataDirInUse error a start on dir would meet, so that a command can
// say so before it tries anything else (its ports, say). Nil when dir or
// its lock file does not exist or the lock is free. It takes the lock for
// a moment to test it.
func CheckDataDir(dir string) error {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil // no lock file: nobody holds it (the start creates it)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return inUse(dir)
		}
		return nil
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return nil
}

// inUse is the ErrDataDirInUse error for dir, naming its holder if it
// recorded itself.
func inUse(dir string) error {
	holder := ""
	if prev, ok := readHolder(dir); ok {
		holder = fmt.Sprintf(" (pid %d, node %s)", prev.PID, prev.Name)
	}
	return fmt.Errorf("%w: %s is held by another meshd%s: give each meshd its own --data-dir", ErrDataDirInUse, dir, holder)
}
