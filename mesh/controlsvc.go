package mesh

import (
	"encoding/json"
	"errors"
	"maps"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"
)

// controlService is the node's NATS micro service (ServiceName): the
// discovery verbs $SRV.PING, $SRV.INFO and $SRV.STATS (all, by name, by
// ID) and the control endpoints, answered in the micro protocol's JSON
// (nats.go micro's Ping, Info and Stats), so `nats micro ls` and meshctl
// discover the nodes as before.
//
// It is not nats.go's micro.AddService because that answers its discovery
// verbs inside nats.go on whatever reply subject the requester names, with
// the node's permissions: an operator asking $SRV.PING with the reply
// $KV.<state bucket>.<key> replaced a hub's durable state with the JSON
// (SECURITY.md). Here every request, verbs included, is answered only on a
// reply subject the node would answer any control request on
// (Node.safeReply: never under "$" or the prefix); others are dropped and
// counted.
//
// Handlers run on the subscriptions' goroutines (one per subject, in
// order); stop is safe to call twice and concurrently with them.
type controlService struct {
	nc      *nats.Conn
	safe    func(reply string) bool
	id      micro.ServiceIdentity
	desc    string
	started time.Time

	mu        sync.Mutex
	subs      []*nats.Subscription
	endpoints []*controlEndpoint
	stopped   bool
}

// controlEndpoint is one control endpoint and its micro statistics.
type controlEndpoint struct {
	name, subject string
	handle        func(data []byte) (any, error)
	stats         micro.EndpointStats // guarded by controlService.mu
}

// newControlService subscribes the discovery verbs of a service named
// ServiceName on nc; safe says which reply subjects may be answered.
func newControlService(nc *nats.Conn, safe func(string) bool, version, desc string, meta map[string]string) (*controlService, error) {
	s := &controlService{
		nc: nc, safe: safe, desc: desc, started: time.Now().UTC(), // real clock: on the wire
		id: micro.ServiceIdentity{Name: ServiceName, ID: nuid.Next(), Version: version, Metadata: maps.Clone(meta)},
	}
	verbs := []struct {
		verb micro.Verb
		body func() any
	}{
		{micro.PingVerb, func() any { return micro.Ping{ServiceIdentity: s.identity(), Type: micro.PingResponseType} }},
		{micro.InfoVerb, func() any { return s.info() }},
		{micro.StatsVerb, func() any { return s.statsReport() }},
	}
	for _, v := range verbs {
		for _, scope := range [][2]string{{"", ""}, {ServiceName, ""}, {ServiceName, s.id.ID}} {
			subj, err := micro.ControlSubject(v.verb, scope[0], scope[1])
			if err != nil {
				s.stop()
				return nil, err
			}
			body := v.body
			if err := s.subscribe(subj, func(m *nats.Msg) {
				b, _ := json.Marshal(body())
				_ = m.Respond(b)
			}); err != nil {
				s.stop()
				return nil, err
			}
		}
	}
	return s, nil
}

// subscribe adds a subscription whose handler runs only for a request with
// a safe reply subject.
func (s *controlService) subscribe(subject string, h func(*nats.Msg)) error {
	sub, err := s.nc.Subscribe(subject, func(m *nats.Msg) {
		if m.Reply == "" || !s.safe(m.Reply) {
			return
		}
		h(m)
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		_ = sub.Unsubscribe()
		return nats.ErrConnectionClosed
	}
	s.subs = append(s.subs, sub)
	return nil
}

// controlError is an endpoint's failure answered with a micro error code
// ("400", "404", "503", …); any other error is answered with code 500.
type controlError struct {
	code string
	err  error
}

func (e *controlError) Error() string { return e.err.Error() }
func (e *controlError) Unwrap() error { return e.err }

// addEndpoint serves name on subject (no queue group): handle's value is
// answered as JSON, its error as a micro service error (the code of a
// *controlError, else 500); then,
// after the answer was published, runs then if not nil.
func (s *controlService) addEndpoint(name, subject string, handle func(data []byte) (any, error), then func()) error {
	e := &controlEndpoint{name: name, subject: subject, handle: handle, stats: micro.EndpointStats{Name: name, Subject: subject}}
	s.mu.Lock()
	s.endpoints = append(s.endpoints, e)
	s.mu.Unlock()
	return s.subscribe(subject, func(m *nats.Msg) {
		start := time.Now() // real clock: processing-time metric
		v, err := e.handle(m.Data)
		var b []byte
		if err == nil {
			b, err = json.Marshal(v)
		}
		if err != nil {
			code := "500"
			if ce, ok := errors.AsType[*controlError](err); ok {
				code = ce.code
			}
			_ = m.RespondMsg(&nats.Msg{Header: nats.Header{micro.ErrorHeader: []string{err.Error()}, micro.ErrorCodeHeader: []string{code}}})
		} else {
			_ = m.Respond(b)
		}
		s.mu.Lock()
		e.stats.NumRequests++
		e.stats.ProcessingTime += time.Since(start)
		e.stats.AverageProcessingTime = e.stats.ProcessingTime / time.Duration(e.stats.NumRequests)
		if err != nil {
			e.stats.NumErrors++
			e.stats.LastError = err.Error()
		}
		s.mu.Unlock()
		if then != nil {
			then()
		}
	})
}

func (s *controlService) identity() micro.ServiceIdentity {
	id := s.id
	id.Metadata = maps.Clone(s.id.Metadata)
	return id
}

func (s *controlService) info() micro.Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	eps := make([]micro.EndpointInfo, 0, len(s.endpoints))
	for _, e := range s.endpoints {
		eps = append(eps, micro.EndpointInfo{Name: e.name, Subject: e.subject})
	}
	return micro.Info{ServiceIdentity: s.identity(), Type: micro.InfoResponseType, Description: s.desc, Endpoints: eps}
}

func (s *controlService) statsReport() micro.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	eps := make([]*micro.EndpointStats, 0, len(s.endpoints))
	for _, e := range s.endpoints {
		st := e.stats
		eps = append(eps, &st)
	}
	return micro.Stats{ServiceIdentity: s.identity(), Type: micro.StatsResponseType, Started: s.started, Endpoints: eps}
}

// stop unsubscribes everything; safe to call twice.
func (s *controlService) stop() {
	s.mu.Lock()
	subs := s.subs
	s.subs, s.stopped = nil, true
	s.mu.Unlock()
	for _, sub := range subs {
		_ = sub.Unsubscribe()
	}
}
