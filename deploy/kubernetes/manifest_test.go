// Package kubernetes holds the Kubernetes manifests of meshd (this
// directory's *.yaml, applied with kubectl apply -f deploy/kubernetes) and
// the test that checks them. It is a module of its own so that the
// Kubernetes API types stay out of the main module's dependencies.
package kubernetes

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// manifests are the decoded objects of every *.yaml here, by kind.
type manifests struct {
	sts  []*appsv1.StatefulSet
	cms  []*corev1.ConfigMap
	svcs []*corev1.Service
	pdbs []*policyv1.PodDisruptionBudget
}

// load decodes every document of every *.yaml file in this directory into
// its k8s.io/api type, refusing unknown fields (a misspelt or misplaced
// field fails here instead of being dropped by the API server) and kinds
// the test does not know.
func load(t *testing.T) manifests {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	var m manifests
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			where := fmt.Sprintf("%s document %d", f, i+1)
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			var obj any
			switch tm.APIVersion + " " + tm.Kind {
			case "apps/v1 StatefulSet":
				o := &appsv1.StatefulSet{}
				m.sts, obj = append(m.sts, o), o
			case "v1 ConfigMap":
				o := &corev1.ConfigMap{}
				m.cms, obj = append(m.cms, o), o
			case "v1 Service":
				o := &corev1.Service{}
				m.svcs, obj = append(m.svcs, o), o
			case "policy/v1 PodDisruptionBudget":
				o := &policyv1.PodDisruptionBudget{}
				m.pdbs, obj = append(m.pdbs, o), o
			default:
				t.Fatalf("%s: unexpected %s %s", where, tm.APIVersion, tm.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Fatalf("%s (%s): %v", where, tm.Kind, err)
			}
		}
	}
	return m
}

func stripComments(doc string) string {
	var b bytes.Buffer
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	bad := "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata:\n  name: x\nspec:\n  maxUnavailabel: 1\n"
	if err := yaml.UnmarshalStrict([]byte(bad), &policyv1.PodDisruptionBudget{}); err == nil {
		t.Fatal("a misspelt field was accepted")
	}
}

// TestManifests checks the manifests against each other and against what
// meshd does: names that refer to each other resolve, probes and the
// metrics annotation name the port meshd serves HTTP on, the grace period
// covers the preStop drain, which covers meshd's drain bound, and the
// Secret the pods mount is the one docs/operations.md tells the operator to
// create.
func TestManifests(t *testing.T) {
	m := load(t)
	if len(m.sts) != 1 || len(m.cms) != 1 || len(m.svcs) != 1 || len(m.pdbs) != 1 {
		t.Fatalf("want one StatefulSet, ConfigMap, Service and PodDisruptionBudget; got %d %d %d %d", len(m.sts), len(m.cms), len(m.svcs), len(m.pdbs))
	}
	sts, cm, svc, pdb := m.sts[0], m.cms[0], m.svcs[0], m.pdbs[0]
	pod := sts.Spec.Template
	podLabels := labels.Set(pod.Labels)

	// Labels and selectors (the NATS chart's app.kubernetes.io/ labels).
	sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(podLabels) {
		t.Errorf("StatefulSet selector %v does not select its pods %v (%v)", sts.Spec.Selector, pod.Labels, err)
	}
	for _, k := range []string{"app.kubernetes.io/name", "app.kubernetes.io/instance"} {
		if pod.Labels[k] == "" || sts.Spec.Selector.MatchLabels[k] != pod.Labels[k] {
			t.Errorf("label %s: pods %q, selector %q", k, pod.Labels[k], sts.Spec.Selector.MatchLabels[k])
		}
	}
	if pdbSel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil || pdbSel.String() != sel.String() {
		t.Errorf("PodDisruptionBudget selects %v, the StatefulSet %v", pdbSel, sel)
	}
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || pdb.Spec.MinAvailable != nil {
		t.Errorf("PodDisruptionBudget: want maxUnavailable 1, got %v / minAvailable %v", pdb.Spec.MaxUnavailable, pdb.Spec.MinAvailable)
	}
	if svc.Name != sts.Spec.ServiceName || svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("serviceName %q: want the headless Service %q (clusterIP %q)", sts.Spec.ServiceName, svc.Name, svc.Spec.ClusterIP)
	}
	if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) {
		t.Errorf("Service selector %v does not select the pods %v", svc.Spec.Selector, pod.Labels)
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas < 2 {
		t.Errorf("replicas %v: want at least 2 for a PodDisruptionBudget of maxUnavailable 1", sts.Spec.Replicas)
	}

	// Anti-affinity: spread over machines, selecting these pods.
	aa := pod.Spec.Affinity
	if aa == nil || aa.PodAntiAffinity == nil || len(aa.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution)+len(aa.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) == 0 {
		t.Fatal("no pod anti-affinity")
	}
	for _, w := range aa.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
		s, err := metav1.LabelSelectorAsSelector(w.PodAffinityTerm.LabelSelector)
		if err != nil || !s.Matches(podLabels) || w.PodAffinityTerm.TopologyKey != corev1.LabelHostname {
			t.Errorf("anti-affinity term %+v does not keep these pods on separate hosts", w.PodAffinityTerm)
		}
	}

	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	env := map[string]string{}
	for k, v := range cm.Data {
		env[k] = v
	}
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil || from.ConfigMapRef.Name != cm.Name {
			t.Errorf("envFrom %+v: want the ConfigMap %q", from, cm.Name)
		}
	}
	if len(c.EnvFrom) == 0 {
		t.Errorf("the container does not read the ConfigMap %q", cm.Name)
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			if e.Name == "MESHD_NAME" && (e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name") {
				t.Errorf("MESHD_NAME: want the pod name, got %+v", e.ValueFrom)
			}
			env[e.Name] = "(from " + e.Name + ")"
			continue
		}
		env[e.Name] = e.Value
	}
	for k := range env {
		if !strings.HasPrefix(k, "MESHD_") {
			t.Errorf("environment %s: meshd reads MESHD_* only", k)
		}
	}
	for _, k := range []string{"MESHD_NAME", "MESHD_NATS_URL", "MESHD_HTTP", "MESHD_DATA_DIR", "MESHD_CREDS", "MESHD_DRAIN_TIMEOUT", "MESHD_KV_REPLICAS"} {
		if env[k] == "" {
			t.Errorf("%s is not set", k)
		}
	}

	// The HTTP port: meshd's --http, the named container port, the probes
	// and the metrics annotations agree.
	_, httpPort, err := splitHostPort(env["MESHD_HTTP"])
	if err != nil {
		t.Fatalf("MESHD_HTTP %q: %v", env["MESHD_HTTP"], err)
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["metrics"] != httpPort {
		t.Errorf("container port metrics %d, MESHD_HTTP port %d", ports["metrics"], httpPort)
	}
	resolve := func(p intstr.IntOrString) int32 {
		if p.Type == intstr.String {
			return ports[p.StrVal]
		}
		return p.IntVal
	}
	for _, pr := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}, {"startup", c.StartupProbe, "/healthz"}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			t.Errorf("%s probe: want an HTTP GET of %s", pr.name, pr.path)
			continue
		}
		if pr.probe.HTTPGet.Path != pr.path || resolve(pr.probe.HTTPGet.Port) != httpPort {
			t.Errorf("%s probe GET %s on port %v; want %s on %d", pr.name, pr.probe.HTTPGet.Path, pr.probe.HTTPGet.Port.String(), pr.path, httpPort)
		}
	}
	if a := pod.Annotations; a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != strconv.Itoa(int(httpPort)) || a["prometheus.io/path"] != "/metrics" {
		t.Errorf("metrics annotations %v: want scrape true, port %d, path /metrics", a, httpPort)
	}
	if len(svc.Spec.Ports) != 1 || resolve(svc.Spec.Ports[0].TargetPort) != httpPort {
		t.Errorf("Service ports %+v: want the metrics port %d", svc.Spec.Ports, httpPort)
	}

	// Grace period > preStop's wait > meshd's drain bound.
	drain, err := time.ParseDuration(env["MESHD_DRAIN_TIMEOUT"])
	if err != nil {
		t.Fatalf("MESHD_DRAIN_TIMEOUT %q: %v", env["MESHD_DRAIN_TIMEOUT"], err)
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Exec == nil {
		t.Fatal("no preStop exec hook")
	}
	cmd := c.Lifecycle.PreStop.Exec.Command
	if len(cmd) < 2 || filepath.Base(cmd[0]) != "meshd" || cmd[1] != "drain" {
		t.Fatalf("preStop %q: want meshd drain", cmd)
	}
	hookWait := time.Minute // meshd drain's default --timeout
	if v := flagValue(cmd, "--timeout"); v != "" {
		if hookWait, err = time.ParseDuration(v); err != nil {
			t.Fatalf("preStop --timeout %q: %v", v, err)
		}
	}
	if dir := flagValue(cmd, "--data-dir"); dir != env["MESHD_DATA_DIR"] {
		t.Errorf("preStop drains %q, meshd's data dir is %q", dir, env["MESHD_DATA_DIR"])
	}
	grace := time.Duration(30) * time.Second
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	if !(grace > hookWait && hookWait > drain) {
		t.Errorf("terminationGracePeriodSeconds %v, preStop wait %v, MESHD_DRAIN_TIMEOUT %v: want grace > wait > drain", grace, hookWait, drain)
	}

	// Volumes: the data dir and the credentials are mounted where meshd's
	// settings point; the Secret is the one the docs create.
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	mountOf := func(path string) (corev1.VolumeMount, bool) {
		var best corev1.VolumeMount
		found := false
		for _, vm := range c.VolumeMounts {
			if (path == vm.MountPath || strings.HasPrefix(path, vm.MountPath+"/")) && len(vm.MountPath) > len(best.MountPath) {
				best, found = vm, true
			}
		}
		return best, found
	}
	for _, vm := range c.VolumeMounts {
		if _, ok := vols[vm.Name]; !ok {
			t.Errorf("volume mount %q names no volume", vm.Name)
		}
	}
	if vm, ok := mountOf(env["MESHD_DATA_DIR"]); !ok || vm.MountPath != env["MESHD_DATA_DIR"] || vols[vm.Name].EmptyDir == nil || vm.ReadOnly {
		t.Errorf("MESHD_DATA_DIR %q: want a writable emptyDir mounted there (it outlives a container restart: the restart proves its predecessor gone)", env["MESHD_DATA_DIR"])
	}
	creds := env["MESHD_CREDS"]
	vm, ok := mountOf(creds)
	if !ok || vols[vm.Name].Secret == nil {
		t.Fatalf("MESHD_CREDS %q is not on a Secret volume", creds)
	}
	secret := vols[vm.Name].Secret
	rel := strings.TrimPrefix(creds, vm.MountPath+"/")
	key := rel
	for _, it := range secret.Items {
		if it.Path == rel {
			key = it.Key
		}
	}
	if len(secret.Items) > 0 && !slices.ContainsFunc(secret.Items, func(it corev1.KeyToPath) bool { return it.Path == rel }) {
		t.Errorf("the Secret volume projects %v, not %q", secret.Items, rel)
	}
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	create := fmt.Sprintf("kubectl create secret generic %s --from-file=%s=", secret.SecretName, key)
	if !strings.Contains(string(doc), create) {
		t.Errorf("docs/operations.md does not tell the operator to create the Secret the pods mount: want %q", create)
	}
	if strings.Contains(env["MESHD_NATS_URL"], "127.0.0.1") || strings.Contains(env["MESHD_NATS_URL"], "localhost") {
		t.Errorf("MESHD_NATS_URL %q: an external cluster, not loopback", env["MESHD_NATS_URL"])
	}
	if pod.Spec.SecurityContext == nil || pod.Spec.SecurityContext.RunAsNonRoot == nil || !*pod.Spec.SecurityContext.RunAsNonRoot {
		t.Error("pods do not run as non-root (the image's user is nonroot)")
	}
}

func splitHostPort(s string) (string, int32, error) {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return "", 0, fmt.Errorf("no port")
	}
	p, err := strconv.ParseUint(s[i+1:], 10, 16)
	return s[:i], int32(p), err
}

// flagValue returns the value of flag in args (--flag value or --flag=value).
func flagValue(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
}
