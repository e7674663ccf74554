// Package buildinfo reads natsmesh's own version from the Go build
// information of the running binary (runtime/debug.ReadBuildInfo): the
// module version and, for a binary built from a git checkout, the VCS
// revision, its time and whether the tree was modified.
package buildinfo

import (
	"runtime/debug"
	"strings"
)

// ModulePath is natsmesh's module path.
const ModulePath = "github.com/natsmesh/natsmesh"

// Release is the natsmesh release this source tree is (semantic
// versioning, without the "v" a module tag has): what nodes announce in
// the registry and control replies (mesh.Version), and the first word of
// every version line, so that `meshd --version` and `meshctl nodes` name
// the same thing whatever the build stamped.
const Release = "0.1.0"

// Info is natsmesh's version in the running binary.
type Info struct {
	// Release is the source tree's release (Release).
	Release string `json:"release"`
	// Version is the module version: a tag or pseudo-version when
	// natsmesh is a dependency or was built with `go install …@version`,
	// "(devel)" for a build from a checkout; "unknown" without build
	// information.
	Version string `json:"version"`
	// Revision, Time and Modified are the VCS stamp of a build from a git
	// checkout (vcs.revision, vcs.time, vcs.modified); empty otherwise.
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	// GoVersion is the toolchain that built the binary.
	GoVersion string `json:"go,omitempty"`
}

// Read returns natsmesh's version in the running binary: the main module's
// when natsmesh is the main module (meshd, meshctl), else the version of the
// natsmesh dependency (a service embedding the library).
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Release: Release, Version: "unknown"}
	}
	return FromBuildInfo(bi)
}

// FromBuildInfo is Read for given build information.
func FromBuildInfo(bi *debug.BuildInfo) Info {
	out := Info{Release: Release, Version: "unknown", GoVersion: bi.GoVersion}
	mod := &bi.Main
	if mod.Path != ModulePath {
		mod = nil
		for _, d := range bi.Deps {
			if d.Path == ModulePath {
				mod = d
				if d.Replace != nil {
					mod = d.Replace
				}
				break
			}
		}
	}
	switch {
	case mod != nil && mod.Version != "":
		out.Version = mod.Version
	case mod != nil:
		out.Version = "(devel)" // replaced by a local directory
	}
	if bi.Main.Path == ModulePath {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				out.Revision = s.Value
			case "vcs.time":
				out.Time = s.Value
			case "vcs.modified":
				out.Modified = s.Value == "true"
			}
		}
	}
	return out
}

// String is the one-line form: "<release>, build <version>", then
// ", revision <12 hex digits>[ (modified)], <time>" when the binary has a
// VCS stamp (the revision only if the version, a pseudo-version, does not
// end with it), then ", <go version>". The build's module version is the
// pseudo-version Go (1.24 and later) stamps from the VCS for a build in a
// git clone, the tag or pseudo-version of `go install …@version`, and
// "(devel)" for a build without a VCS stamp (go run, -buildvcs=false).
func (i Info) String() string {
	var b strings.Builder
	if i.Release != "" {
		b.WriteString(i.Release + ", build ")
	}
	b.WriteString(i.Version)
	if i.Revision != "" {
		rev := i.Revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if !strings.HasSuffix(i.Version, "-"+rev) { // a pseudo-version names it already
			b.WriteString(", revision " + rev)
		}
		if i.Modified {
			b.WriteString(" (modified)")
		}
		if i.Time != "" {
			b.WriteString(", " + i.Time)
		}
	}
	if i.GoVersion != "" {
		b.WriteString(", " + i.GoVersion)
	}
	return b.String()
}

// Short is the version and, with a VCS stamp, the first 12 digits of the
// revision ("(devel) 1a2b3c4d5e6f", "+dirty" when modified): for tables.
func (i Info) Short() string {
	if i.Revision == "" {
		return i.Version
	}
	rev := i.Revision
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if strings.HasSuffix(i.Version, "-"+rev) {
		rev = "" // a pseudo-version names it already
	}
	if i.Modified {
		rev += "+dirty"
	}
	if rev == "" {
		return i.Version
	}
	return i.Version + " " + rev
}
