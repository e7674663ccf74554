// Package envflag lets command-line flags (pflag, as cobra uses) read
// environment variables, each value parsed by its flag's own parser: a value
// the flag would reject on the command line is an error naming the variable,
// never a silent default. The command line wins over the environment.
package envflag

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
)

// Binding ties a flag to the environment variables it reads.
type Binding struct {
	Flag string
	Keys []string // the first one set wins
}

// Set is a flag set's bindings.
type Set struct {
	fs    *pflag.FlagSet
	binds []Binding
}

// New returns an empty Set for fs.
func New(fs *pflag.FlagSet) *Set { return &Set{fs: fs} }

// Bind makes flag read the first of keys that is set, and appends
// " (KEY)" to its usage. It panics if fs has no such flag (a programming
// error).
func (s *Set) Bind(flag string, keys ...string) {
	f := s.fs.Lookup(flag)
	if f == nil {
		panic("envflag: no flag --" + flag)
	}
	f.Usage += " (" + strings.Join(keys, ", ") + ")"
	s.binds = append(s.binds, Binding{Flag: flag, Keys: keys})
}

// Bindings returns the bindings in the order they were made.
func (s *Set) Bindings() []Binding { return append([]Binding(nil), s.binds...) }

// Apply sets every bound flag that was not given on the command line from
// its environment variable, if set (os.LookupEnv when lookup is nil). The
// first value a flag's parser rejects is returned as an error naming the
// variable and the value.
func (s *Set) Apply(lookup func(string) (string, bool)) error {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	for _, b := range s.binds {
		f := s.fs.Lookup(b.Flag)
		if f.Changed {
			continue
		}
		for _, k := range b.Keys {
			v, ok := lookup(k)
			if !ok {
				continue
			}
			if err := s.fs.Set(b.Flag, v); err != nil {
				return fmt.Errorf("invalid %s=%q (for --%s): %s", k, v, b.Flag, hint(f.Value.Type(), err))
			}
			break
		}
	}
	return nil
}

// hint explains what a flag of type typ wants: for the built-in types a
// fixed phrase, else the parser's own reason without pflag's "invalid
// argument ... for ... flag" wrapping, which would repeat the value and the
// flag the message names already.
func hint(typ string, err error) string {
	switch typ {
	case "duration":
		return "want a duration with a unit, e.g. 500ms, 10s, 2m"
	case "bool":
		return "want true or false"
	case "int", "int64", "uint", "uint64":
		return "want an integer"
	}
	msg := err.Error()
	if strings.HasPrefix(msg, "invalid argument ") {
		if _, reason, ok := strings.Cut(msg, " flag: "); ok {
			return reason
		}
	}
	return msg
}
