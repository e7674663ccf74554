package docs

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// requireVersion returns the version mod's go.mod text requires of module.
func requireVersion(t *testing.T, gomod, module string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?` + regexp.QuoteMeta(module) + `\s+(v\S+)`).FindStringSubmatch(gomod)
	if m == nil {
		t.Fatalf("go.mod does not require %s", module)
	}
	return m[1]
}

// TestToolInstallLines: the install lines of docs/operations.md §7 and the
// README name the nats-server that go.mod requires (the one the tests run)
// and one nats CLI version, the same in both places.
func TestToolInstallLines(t *testing.T) {
	ops, readme := read(t, "operations.md"), read(t, "../README.md")
	server := requireVersion(t, read(t, "../go.mod"), "github.com/nats-io/nats-server/v2")
	if want := "go install github.com/nats-io/nats-server/v2@" + server; !strings.Contains(ops, want) {
		t.Errorf("operations.md lacks %q (go.mod's nats-server)", want)
	}
	for name, doc := range map[string]string{"operations.md": ops, "README.md": readme} {
		for _, m := range regexp.MustCompile(`nats-server/v2@(v[0-9.]+)|nats-server (v2\.[0-9.]+[0-9])`).FindAllStringSubmatch(doc, -1) {
			if v := m[1] + m[2]; v != server {
				t.Errorf("%s names nats-server %s; go.mod has %s", name, v, server)
			}
		}
	}
	cli := regexp.MustCompile("go install github.com/nats-io/natscli/nats@(v[0-9.]+)")
	var versions []string
	for _, name := range []string{"operations.md", "README.md"} {
		doc := map[string]string{"operations.md": ops, "README.md": readme}[name]
		m := cli.FindStringSubmatch(doc)
		if m == nil {
			t.Errorf("%s has no install line for the nats CLI", name)
			continue
		}
		versions = append(versions, m[1])
	}
	if len(versions) == 2 && versions[0] != versions[1] {
		t.Errorf("the nats CLI versions differ: operations.md and README.md name %v", versions)
	}
}

// TestTracingSection: docs/operations.md §8 builds the Jaeger that
// tools/jaeger pins (its tool, its version), git ignores the binary that
// build leaves, and every OTEL_* variable meshd's tracing code reads itself
// is in the section.
func TestTracingSection(t *testing.T) {
	ops := read(t, "operations.md")
	i := strings.Index(ops, "## 8. Tracing")
	if i < 0 {
		t.Fatal("operations.md has no section 8. Tracing")
	}
	sec := ops[i:]
	if j := strings.Index(sec[1:], "\n## "); j >= 0 {
		sec = sec[:j+1]
	}
	tools := read(t, "../tools/jaeger/go.mod")
	tool := regexp.MustCompile(`(?m)^tool\s+(\S+)`).FindStringSubmatch(tools)
	if tool == nil {
		t.Fatal("tools/jaeger/go.mod has no tool directive")
	}
	if want := "cd tools/jaeger && go build -o jaeger " + tool[1]; !strings.Contains(sec, want) {
		t.Errorf("§8 lacks the build line %q", want)
	}
	if v := requireVersion(t, tools, "github.com/jaegertracing/jaeger"); !strings.Contains(sec, "`github.com/jaegertracing/jaeger` "+v) {
		t.Errorf("§8 does not name tools/jaeger's version %s", v)
	}
	if !slices.Contains(strings.Split(read(t, "../.gitignore"), "\n"), "/tools/jaeger/jaeger") {
		t.Error(".gitignore does not ignore /tools/jaeger/jaeger, which §8's build leaves")
	}
	for _, k := range regexp.MustCompile(`"(OTEL_[A-Z_]+)"`).FindAllStringSubmatch(read(t, "../daemon/tracing.go"), -1) {
		if !strings.Contains(sec, "`"+k[1]+"`") && !strings.Contains(sec, "`"+k[1]+"=") {
			t.Errorf("§8 does not mention %s, which daemon/tracing.go reads", k[1])
		}
	}
}
