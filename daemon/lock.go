package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockDir takes an exclusive advisory lock on dir/meshd.lock, so two
// embedded servers never share one JetStream store; closing the returned
// file (or the process exiting) releases it.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, "meshd.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("daemon: lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("daemon: data dir %s is in use by another meshd (%w)", dir, err)
	}
	return f, nil
}
