package integration

import (
	"fmt"
	"github.com/natsmesh/natsmesh/internal/natstest"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/natsmesh/natsmesh/mesh/membership"
)

// BenchmarkDepartureDetection measures, on a real 3-server cluster, how long
// after a node's departure a peer on another server learns it: after a
// SIGKILL (the disconnect advisory), and after a graceful SIGTERM drain
// (from the signal: the drain of an idle node plus its Left event). Run with
//
//	go test -run '^$' -bench DepartureDetection -benchtime 20x ./integration/
func BenchmarkDepartureDetection(b *testing.B) {
	c := StartCluster(b, 3)
	c.WaitReady(b)
	tc := clientNodeTB(b, c.URLs()[0])
	var kill, drainSignal []time.Duration
	for i := 0; i < b.N; i++ {
		for _, graceful := range []bool{false, true} {
			name := fmt.Sprintf("d%d", i)
			if graceful {
				name += "g"
			}
			nd := StartTestNode(b, "--name", name, "--nats-url", c.URLs()[1+i%2], "--kv-replicas", "3")
			natstest.Eventually(b, 30*time.Second, func() bool { return len(tc.Members().Hosting("hold")) == 1 }, "%s joined", name)
			seen := make(chan membership.Event, 4)
			stop := tc.Members().OnEvent(func(e membership.Event) {
				if e.Type.Departed() && e.Member.Node.Name == name {
					seen <- e
				}
			})
			sig := syscall.SIGKILL
			if graceful {
				sig = syscall.SIGTERM
			}
			at := time.Now()
			if err := nd.Signal(sig); err != nil {
				b.Fatal(err)
			}
			var e membership.Event
			select {
			case e = <-seen:
			case <-time.After(30 * time.Second):
				b.Fatal("departure not seen")
			}
			stop()
			if graceful {
				drainSignal = append(drainSignal, e.At.Sub(at))
			} else {
				kill = append(kill, e.At.Sub(at))
			}
			nd.Wait(b, 30*time.Second)
		}
	}
	report := func(d []time.Duration, unit string) {
		slices.Sort(d)
		b.ReportMetric(float64(d[len(d)/2].Microseconds())/1000, unit+"-p50-ms")
		b.ReportMetric(float64(d[(len(d)-1)*99/100].Microseconds())/1000, unit+"-p99-ms")
	}
	report(kill, "sigkill")
	report(drainSignal, "sigterm")
	b.Logf("SIGKILL detection: %v", kill)
	b.Logf("SIGTERM (drain) to departure: %v", drainSignal)
}
