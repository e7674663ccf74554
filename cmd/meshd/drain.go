package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/natsmesh/natsmesh/daemon"
)

// newDrainCmd is "meshd drain": drain the meshd that holds a data
// directory on this machine and wait until it has exited — a Kubernetes
// preStop hook, or a service manager's stop command, in an image without a
// shell.
func newDrainCmd(stdout io.Writer) *cobra.Command {
	dir, timeout := daemon.DefaultDataDir, time.Minute
	if v, ok := os.LookupEnv("MESHD_DATA_DIR"); ok && v != "" {
		dir = v
	}
	cmd := &cobra.Command{
		Use:   "drain",
		Short: "Drain the meshd holding --data-dir and wait until it has exited",
		Long: `meshd drain finds the meshd that holds the OS lock on --data-dir (default
$MESHD_DATA_DIR, else meshd-data), sends it SIGTERM — it drains within its
own --drain-timeout, as on any SIGTERM — and waits until it has exited (its
lock is free), at most --timeout. Use it as a Kubernetes preStop hook
(deploy/kubernetes): the pod's terminationGracePeriodSeconds must exceed
--timeout, and --timeout the node's --drain-timeout.

Exit codes: 0 the node drained and exited (it recorded a clean drain in
the directory on its way out), or no meshd holds the directory (nothing to
drain); 1 bad usage, or no such directory (a mistyped --data-dir would
otherwise pass as "nothing to drain"); 2 the node did not exit within --timeout, could not be
signalled, or exited without a clean drain (its drain was cut short by its
--drain-timeout, it failed, or it was killed: its log says why).`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if timeout <= 0 {
				return usageError{fmt.Errorf("--timeout %v: want > 0", timeout)}
			}
			if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
				return usageError{fmt.Errorf("--data-dir %s: no such directory (the data directory of the meshd to drain)", dir)}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			start := time.Now()
			pid, err := daemon.DrainHolder(ctx, dir)
			switch {
			case errors.Is(err, daemon.ErrNoHolder):
				fmt.Fprintf(stdout, "meshd drain: no meshd holds %s: nothing to drain\n", dir)
				return nil
			case err != nil:
				return err
			}
			fmt.Fprintf(stdout, "meshd drain: meshd (pid %d) on %s drained and exited in %v\n", pid, dir, time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	cmd.Flags().StringVar(&dir, "data-dir", dir, "the data directory of the meshd to drain")
	cmd.Flags().DurationVar(&timeout, "timeout", timeout, "how long to wait for it to exit (above its --drain-timeout)")
	return cmd
}
