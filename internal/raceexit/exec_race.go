//go:build race && unix

package raceexit

import (
	"os"
	"syscall"
)

const enabled = true

func execSelf(gorace string) {
	exe, err := os.Executable()
	if err != nil {
		return
	}
	old, had := os.LookupEnv("GORACE")
	if err := os.Setenv("GORACE", gorace); err != nil {
		return
	}
	_ = syscall.Exec(exe, os.Args, os.Environ()) // returns only if it failed
	if had {
		_ = os.Setenv("GORACE", old)
	} else {
		_ = os.Unsetenv("GORACE")
	}
}
