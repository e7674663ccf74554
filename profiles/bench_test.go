package profiles_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsmesh/natsmesh/subjects"
	"github.com/natsmesh/natsmesh/verdict"
)

// BenchmarkServiceImport is the cost of the production mode's service
// import on the ingress, in one run on one server configured by
// profiles.MultiAccountConf with one node: ingress deliveries (128-byte
// payload, the mesh generating IDs) by a caller in the tenant account ALICE
// — crossing the import: the server stamps Nats-Request-Info and maps the
// reply through _R_ — against the same by the operator in the mesh account
// itself (no import, its inbox as the reply). "sequential" sends one at a
// time; "lanes256" keeps 256 in flight on 256 streams.
func BenchmarkServiceImport(b *testing.B) {
	e := newMultiSecured(b)
	e.node(b, "bench", "node")
	payload := make([]byte, 128)
	for _, caller := range []struct{ name, profile string }{{"mesh-account", "operator"}, {"service-import", "client"}} {
		nc := e.conn(b, caller.profile)
		send := func(stream string) error {
			m := &nats.Msg{Subject: subjects.DefaultPrefix.Ingress("echo/bench", subjects.Stream(stream)), Header: nats.Header{}, Data: payload}
			r, err := nc.RequestMsg(m, 5*time.Second)
			if err != nil {
				return err
			}
			_, err = verdict.Decode(r.Header)
			return err
		}
		if err := send(""); err != nil { // warm: the activation is built
			b.Fatal(err)
		}
		b.Run(caller.name+"/sequential", func(b *testing.B) {
			for b.Loop() {
				if err := send(""); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(caller.name+"/lanes256", func(b *testing.B) {
			const lanes = 256
			var wg sync.WaitGroup
			errs := make(chan error, lanes)
			next := make(chan struct{}, lanes)
			b.ResetTimer()
			for i := range lanes {
				wg.Go(func() {
					stream := fmt.Sprintf("lane-%d", i)
					for range next {
						if err := send(stream); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			for range b.N {
				next <- struct{}{}
			}
			close(next)
			wg.Wait()
			b.StopTimer()
			select {
			case err := <-errs:
				b.Fatal(err)
			default:
			}
		})
	}
}
