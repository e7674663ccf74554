package raceexit

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// raceChildEnv makes this test binary race two goroutines and exit 0
// instead of running its tests (TestRaceStillFailsTheExit).
const raceChildEnv = "NATSMESH_RACEEXIT_CHILD"

func TestMain(m *testing.M) {
	Exec()
	if os.Getenv(raceChildEnv) == "1" {
		raceThenExit()
	}
	os.Exit(m.Run())
}

// raceThenExit writes a variable from two goroutines unsynchronized, then
// exits with status 0.
func raceThenExit() {
	var x int
	done := make(chan struct{})
	go func() {
		x++
		close(done)
	}()
	x++
	<-done
	os.Exit(0)
}

func TestEnviron(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"", "atexit_sleep_ms=0", true},
		{"halt_on_error=1", "halt_on_error=1 atexit_sleep_ms=0", true},
		{"log_path=/tmp/r:history_size=3", "log_path=/tmp/r:history_size=3 atexit_sleep_ms=0", true},
		{"atexit_sleep_ms=2000", "atexit_sleep_ms=2000", false},
		{"halt_on_error=1,atexit_sleep_ms=0", "halt_on_error=1,atexit_sleep_ms=0", false},
		{"halt_on_error=1:atexit_sleep_ms=5", "halt_on_error=1:atexit_sleep_ms=5", false},
		{"log_path=atexit_sleep_ms_log", "log_path=atexit_sleep_ms_log atexit_sleep_ms=0", true},
	} {
		got, ok := environ(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("environ(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// TestReexecuted: built with -race, this binary runs re-executed by
// TestMain's Exec, with the option in its environment.
func TestReexecuted(t *testing.T) {
	if !enabled {
		t.Skip("built without -race (or not on Unix): Exec does nothing")
	}
	if _, ok := environ(os.Getenv("GORACE")); ok {
		t.Fatalf("GORACE=%q: Exec did not re-execute the test binary", os.Getenv("GORACE"))
	}
}

// TestRaceStillFailsTheExit: without the pause, a binary that reported a
// race still says so and exits with status 66 (the race runtime's), not 0.
func TestRaceStillFailsTheExit(t *testing.T) {
	if !enabled {
		t.Skip("built without -race (or not on Unix)")
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), raceChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 66 || !bytes.Contains(out, []byte("WARNING: DATA RACE")) {
		t.Fatalf("child with a race: %v (GORACE=%q), want exit status 66 and a race report; output:\n%s", err, os.Getenv("GORACE"), out)
	}
}

// execFirst matches a TestMain whose first statement calls Exec.
var execFirst = regexp.MustCompile(`func TestMain\(\w+ \*testing\.M\) \{\n\s*raceexit\.Exec\(\)`)

// TestEveryTestMainCallsExec: each package of the module with tests calls
// Exec first in its TestMain (a package without it pays the pause again).
func TestEveryTestMainCallsExec(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root %s: %v", root, err)
	}
	self, _ := filepath.Abs(".")
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "node_modules") {
			return filepath.SkipDir
		}
		if path != root {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // a module of its own (tools/jaeger, deploy/kubernetes)
			}
		}
		tests, _ := filepath.Glob(filepath.Join(path, "*_test.go"))
		if len(tests) == 0 || path == self {
			return nil
		}
		checked++
		for _, f := range tests {
			b, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			if bytes.Contains(b, []byte("func TestMain(")) {
				if !execFirst.Match(b) {
					rel, _ := filepath.Rel(root, f)
					t.Errorf("%s: TestMain does not call raceexit.Exec() first", rel)
				}
				return nil
			}
		}
		rel, _ := filepath.Rel(root, path)
		t.Errorf("%s: no TestMain calling raceexit.Exec() (add one: see internal/raceexit)", rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 20 {
		t.Errorf("checked %d packages with tests under %s, expected the module's two dozen", checked, root)
	}
}
