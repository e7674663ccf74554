// Package envflag lets command-line flags (pflag, as cobra uses) read
// environment variables, each value parsed by its flag's own parser: a value
// the flag would reject on the command line is an error naming the variable,
// never a silent default. The command line wins over the environment.
package envflag

import (
	"errors"
	"fmt"
	"os"
	"strconv"
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
	fs     *pflag.FlagSet
	binds  []Binding
	source map[string]string // flag -> the variable Apply set it from
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
// its environment variable, if set (os.LookupEnv when lookup is nil), and
// records the variable as the flag's [Set.Source]. The first value a flag's
// parser rejects is returned as an error naming the variable and the value:
// `invalid KEY="value" (for --flag): reason`.
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
			if s.source == nil {
				s.source = map[string]string{}
			}
			s.source[b.Flag] = k
			break
		}
	}
	return nil
}

// Source returns the environment variable that Apply set flag from, or ""
// when the flag was given on the command line, or not set at all.
func (s *Set) Source(flag string) string { return s.source[flag] }

// Origin names where flag's value came from, for an error message about
// it: the variable Apply set it from, else "--flag".
func (s *Set) Origin(flag string) string {
	if k := s.Source(flag); k != "" {
		return k
	}
	return "--" + flag
}

// Setting is Origin with the value, as a user would have written it:
// KEY="value" for a variable, --flag="value" for a flag.
func (s *Set) Setting(flag string) string {
	v := ""
	if f := s.fs.Lookup(flag); f != nil {
		v = f.Value.String()
	}
	return fmt.Sprintf("%s=%q", s.Origin(flag), v)
}

// hint explains what a flag of type typ wants: for a value the built-in
// parsers of durations, booleans and integers reject, a fixed phrase; else
// (a flag's own check, say a negative duration a custom Value refuses) the
// parser's own reason, without pflag's "invalid argument ... for ... flag"
// wrapping, which would repeat the value and the flag the message names
// already.
func hint(typ string, err error) string {
	var iv *pflag.InvalidValueError
	if errors.As(err, &iv) && iv.Unwrap() != nil {
		err = iv.Unwrap()
	}
	var ne *strconv.NumError
	parseErr := errors.As(err, &ne) || strings.HasPrefix(err.Error(), "time: ")
	switch {
	case parseErr && typ == "duration":
		return "want a duration with a unit, e.g. 500ms, 10s, 2m"
	case parseErr && typ == "bool":
		return "want true or false"
	case parseErr && (typ == "int" || typ == "int64" || typ == "uint" || typ == "uint64"):
		return "want an integer"
	}
	return err.Error()
}
