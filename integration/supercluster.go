package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"
)

// Supercluster is several Clusters joined by gateways (DESIGN §12).
type Supercluster struct {
	Clusters []*Cluster
}

// StartSupercluster starts two clusters of n servers each on loopback,
// "east" and "west", joined by gateways (every server lists every gateway
// URL of both clusters). JetStream runs in east only: the mesh's registry,
// directory and state live there (docs/DESIGN.md "Beyond one cluster"), and
// the JetStream meta group is east's n servers, so losing west keeps its
// quorum. West's servers forward the JetStream API over the gateway. Call
// WaitReady before using it.
func StartSupercluster(t testing.TB, n int) *Supercluster {
	t.Helper()
	for attempt := 1; ; attempt++ {
		cs, err := startClusters(t, []clusterSpec{{name: "east", n: n, jetstream: true}, {name: "west", n: n}}, ClusterAccountsConf)
		if err == nil {
			return &Supercluster{Clusters: cs}
		}
		for _, c := range cs {
			c.stopAll()
		}
		if attempt == 3 {
			t.Fatalf("StartSupercluster: %v", err)
		}
		t.Logf("StartSupercluster: %v; retrying with new ports", err)
	}
}

// East is the cluster that runs JetStream; West the other.
func (sc *Supercluster) East() *Cluster { return sc.Clusters[0] }

// West is the cluster without JetStream.
func (sc *Supercluster) West() *Cluster { return sc.Clusters[1] }

// WaitReady waits until every running server is healthy (WaitReady of each
// cluster) and has an outbound gateway connection to every other cluster
// whose servers are running.
func (sc *Supercluster) WaitReady(t testing.TB) {
	t.Helper()
	start := time.Now()
	for _, c := range sc.Clusters {
		c.WaitReady(t)
	}
	t.Logf("supercluster: every server healthy in %v", time.Since(start))
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for _, c := range sc.Clusters {
		for _, s := range c.servers {
			if s.NATSServer == nil {
				continue
			}
			for _, o := range sc.Clusters {
				if o == c || !o.anyRunning() {
					continue
				}
				for {
					ok, why := outboundGateway(client, s.MonitorPort, o.Name)
					if ok {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s has no outbound gateway to %s after 30s: %s", s.Name, o.Name, why)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
		}
	}
}

func (c *Cluster) anyRunning() bool {
	for _, s := range c.servers {
		if s.NATSServer != nil {
			return true
		}
	}
	return false
}

// outboundGateway reports whether the server monitored on port has an
// outbound gateway connection to the cluster named gw.
func outboundGateway(client *http.Client, port int, gw string) (bool, string) {
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/gatewayz", port))
	if err != nil {
		return false, err.Error()
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var gz struct {
		Outbound map[string]json.RawMessage `json:"outbound_gateways"`
	}
	if err := json.Unmarshal(b, &gz); err != nil {
		return false, err.Error()
	}
	_, ok := gz.Outbound[gw]
	return ok, string(b)
}

// KillAll SIGKILLs every running server of c.
func (c *Cluster) KillAll() {
	c.t.Helper()
	for i, s := range c.servers {
		if s.NATSServer != nil {
			c.Kill(i)
		}
	}
}

// CutGateways cuts every gateway connection between the clusters (each
// server's gateway proxy) in mode, with every server up: each cluster goes
// on alone, its clients' links intact. It returns when the gateways in
// effect stopped: the latest time any of their proxies moved bytes (see
// Proxy.Cut), at most now.
func (sc *Supercluster) CutGateways(mode CutMode) time.Time {
	var stopped time.Time
	for _, c := range sc.Clusters {
		for _, s := range c.servers {
			if at := s.GatewayProxy.Cut(mode); at.After(stopped) {
				stopped = at
			}
		}
	}
	return stopped
}

// RestoreGateways undoes CutGateways.
func (sc *Supercluster) RestoreGateways() {
	for _, c := range sc.Clusters {
		for _, s := range c.servers {
			s.GatewayProxy.Restore()
		}
	}
}
