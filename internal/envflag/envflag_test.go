package envflag

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

type vals struct {
	d time.Duration
	b bool
	n int
	s string
}

func newSet() (*pflag.FlagSet, *Set, *vals) {
	var v vals
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.DurationVar(&v.d, "drain", 30*time.Second, "drain")
	fs.BoolVar(&v.b, "standalone", false, "standalone")
	fs.IntVar(&v.n, "replicas", 1, "replicas")
	fs.StringVar(&v.s, "url", "def", "url")
	s := New(fs)
	s.Bind("drain", "X_DRAIN")
	s.Bind("standalone", "X_STANDALONE")
	s.Bind("replicas", "X_REPLICAS")
	s.Bind("url", "X_URL", "X_URL_FALLBACK")
	return fs, s, &v
}

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestApplyRejectsWhatTheFlagRejects(t *testing.T) {
	for _, tc := range []struct{ key, val string }{
		{"X_DRAIN", "10"}, {"X_DRAIN", "bogus"}, {"X_DRAIN", ""}, {"X_DRAIN", "10 s"},
		{"X_STANDALONE", "yes"}, {"X_STANDALONE", "on"}, {"X_STANDALONE", ""},
		{"X_REPLICAS", "three"}, {"X_REPLICAS", "3.0"}, {"X_REPLICAS", ""},
	} {
		fs, s, _ := newSet()
		_ = fs.Parse(nil)
		err := s.Apply(env(map[string]string{tc.key: tc.val}))
		if err == nil {
			t.Errorf("%s=%q accepted", tc.key, tc.val)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, tc.key) || strings.Contains(msg, "\n") {
			t.Errorf("%s=%q: error %q does not name the variable on one line", tc.key, tc.val, msg)
		}
		// The same value on the command line is rejected too.
		fs2, _, _ := newSet()
		flag := map[string]string{"X_DRAIN": "drain", "X_STANDALONE": "standalone", "X_REPLICAS": "replicas"}[tc.key]
		if err := fs2.Parse([]string{"--" + flag + "=" + tc.val}); err == nil {
			t.Errorf("--%s=%q accepted on the command line but not from %s", flag, tc.val, tc.key)
		}
	}
}

func TestApplyValuesAndPrecedence(t *testing.T) {
	fs, s, v := newSet()
	if err := fs.Parse([]string{"--replicas=5"}); err != nil {
		t.Fatal(err)
	}
	err := s.Apply(env(map[string]string{"X_DRAIN": "10s", "X_STANDALONE": "true", "X_REPLICAS": "3", "X_URL_FALLBACK": "nats://b"}))
	if err != nil {
		t.Fatal(err)
	}
	if v.d != 10*time.Second || !v.b || v.n != 5 || v.s != "nats://b" {
		t.Fatalf("got %+v; want env values, the command line's --replicas, the fallback key", *v)
	}
	if u := fs.Lookup("url").Usage; u != "url (X_URL, X_URL_FALLBACK)" {
		t.Errorf("usage %q", u)
	}
	// The first key set wins.
	fs, s, v = newSet()
	_ = fs.Parse(nil)
	if err := s.Apply(env(map[string]string{"X_URL": "nats://a", "X_URL_FALLBACK": "nats://b"})); err != nil || v.s != "nats://a" {
		t.Fatalf("url %q, err %v", v.s, err)
	}
}

// nonNeg is a duration flag with a check of its own.
type nonNeg struct{ d time.Duration }

func (n *nonNeg) String() string { return n.d.String() }
func (n *nonNeg) Type() string   { return "duration" }
func (n *nonNeg) Set(v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return err
	}
	if d < 0 {
		return errors.New("want a duration of 0 or more")
	}
	n.d = d
	return nil
}

// TestApplyKeepsTheCheckersReason: a value a flag's own check refuses is
// reported with that check's reason, not the fixed phrase of its type's
// parser (a negative duration is not "a duration without a unit").
func TestApplyKeepsTheCheckersReason(t *testing.T) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.Var(&nonNeg{}, "wait", "wait")
	s := New(fs)
	s.Bind("wait", "X_WAIT")
	for val, want := range map[string]string{
		"-1s": `invalid X_WAIT="-1s" (for --wait): want a duration of 0 or more`,
		"10":  `invalid X_WAIT="10" (for --wait): want a duration with a unit, e.g. 500ms, 10s, 2m`,
	} {
		err := s.Apply(env(map[string]string{"X_WAIT": val}))
		if err == nil || err.Error() != want {
			t.Errorf("X_WAIT=%q: error %v, want %q", val, err, want)
		}
	}
}

// TestSourceAndOrigin: Apply records the variable a flag was set from; a
// flag from the command line, or left at its default, has none.
func TestSourceAndOrigin(t *testing.T) {
	fs, s, _ := newSet()
	if err := fs.Parse([]string{"--replicas=5"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(env(map[string]string{"X_DRAIN": "10s", "X_REPLICAS": "3", "X_URL_FALLBACK": "nats://b"})); err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{"drain": "X_DRAIN", "url": "X_URL_FALLBACK", "replicas": "", "standalone": ""} {
		if got := s.Source(flag); got != want {
			t.Errorf("Source(%q) = %q, want %q", flag, got, want)
		}
	}
	for flag, want := range map[string]string{"drain": `X_DRAIN="10s"`, "url": `X_URL_FALLBACK="nats://b"`, "replicas": `--replicas="5"`} {
		if got := s.Setting(flag); got != want {
			t.Errorf("Setting(%q) = %q, want %q", flag, got, want)
		}
	}
	if got := s.Origin("standalone"); got != "--standalone" {
		t.Errorf("Origin(standalone) = %q", got)
	}
}
