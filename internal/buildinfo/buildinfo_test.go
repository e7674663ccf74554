package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name      string
		bi        debug.BuildInfo
		want      Info
		str, shrt string
	}{
		{
			name: "main module from a checkout",
			bi: debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: ModulePath, Version: "(devel)"}, Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-12-01T08:00:00Z"}, {Key: "vcs.modified", Value: "true"},
			}},
			want: Info{Release: Release, Version: "(devel)", Revision: "0123456789abcdef0123", Time: "2026-12-01T08:00:00Z", Modified: true, GoVersion: "go1.26.0"},
			str:  "0.1.0, build (devel), revision 0123456789ab (modified), 2026-12-01T08:00:00Z, go1.26.0",
			shrt: "(devel) 0123456789ab+dirty",
		},
		{
			name: "pseudo-version of a clean clone",
			bi: debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: ModulePath, Version: "v0.0.0-20261201091305-3a5b8f5645f0"}, Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "3a5b8f5645f0aaaa"}, {Key: "vcs.time", Value: "2026-12-01T09:13:05Z"}, {Key: "vcs.modified", Value: "false"},
			}},
			want: Info{Release: Release, Version: "v0.0.0-20261201091305-3a5b8f5645f0", Revision: "3a5b8f5645f0aaaa", Time: "2026-12-01T09:13:05Z", GoVersion: "go1.26.0"},
			str:  "0.1.0, build v0.0.0-20261201091305-3a5b8f5645f0, 2026-12-01T09:13:05Z, go1.26.0",
			shrt: "v0.0.0-20261201091305-3a5b8f5645f0",
		},
		{
			name: "dependency of another module",
			bi: debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "example.com/svc", Version: "(devel)"},
				Deps:     []*debug.Module{{Path: "other/x", Version: "v1.0.0"}, {Path: ModulePath, Version: "v0.3.1"}},
				Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "ffff"}}},
			want: Info{Release: Release, Version: "v0.3.1", GoVersion: "go1.26.0"},
			str:  "0.1.0, build v0.3.1, go1.26.0", shrt: "v0.3.1",
		},
		{
			name: "replaced dependency",
			bi: debug.BuildInfo{Main: debug.Module{Path: "example.com/svc"},
				Deps: []*debug.Module{{Path: ModulePath, Version: "v0.0.0", Replace: &debug.Module{Path: "../natsmesh"}}}},
			want: Info{Release: Release, Version: "(devel)"},
			str:  "0.1.0, build (devel)", shrt: "(devel)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := FromBuildInfo(&tc.bi)
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if s := got.String(); s != tc.str {
				t.Errorf("String() = %q, want %q", s, tc.str)
			}
			if s := got.Short(); s != tc.shrt {
				t.Errorf("Short() = %q, want %q", s, tc.shrt)
			}
		})
	}
}

func TestReadInTest(t *testing.T) {
	// A test binary's main module is natsmesh.
	if got := Read(); got.Version == "" {
		t.Fatalf("Read() = %+v", got)
	}
}
