package mesh

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/natsmesh/natsmesh/hub"
	"github.com/natsmesh/natsmesh/subjects"
)

// NodeConfig holds a Node's settings. Conn and Name are required.
type NodeConfig struct {
	// Conn is the node's NATS connection. Required.
	Conn *nats.Conn
	// Name is the node name, [A-Za-z0-9_-]{1,64}. Required.
	Name string
	// Generation is this incarnation's generation; zero means the start
	// time in nanoseconds since the epoch (strictly increasing across
	// restarts of one host). The membership layer replaces this with a
	// registry revision.
	Generation uint64
	// Prefix is the subject prefix; zero means subjects.DefaultPrefix.
	Prefix subjects.Prefix
	// Resolver maps addresses to owners; nil means every address is owned
	// by this node (a one-node mesh).
	Resolver Resolver
	// Host tunes the receiving side (inbox size, dedupe window, idle
	// timeout, claims); its Conn, Node, Prefix and Logger are set by the
	// Node.
	Host hub.Config
	// Logger receives structured logs; nil means slog.Default().
	Logger *slog.Logger
	// DisableIngress turns off serving <prefix>.in.*.* (on by default).
	DisableIngress bool
	// DisableControl turns off the micro service and control endpoints
	// (on by default).
	DisableControl bool
	// OnDrainRequest runs when a drain is requested over the control
	// subject (meshctl drain); nil means Drain with DefaultDrainTimeout.
	// A daemon sets it to begin its own shutdown.
	OnDrainRequest func()
	// IngressConcurrency bounds ingress deliveries forwarded at once;
	// zero means DefaultIngressConcurrency.
	IngressConcurrency int
}

// Node is one mesh process: a hub host that receives deliveries for its node
// generation and a client that sends them. Safe for concurrent use.
type Node struct {
	*Client
	cfg     NodeConfig
	host    *hub.Host
	id      subjects.NodeID
	conn    *nats.Conn
	prefix  subjects.Prefix
	log     *slog.Logger
	started time.Time

	ingressSub   *nats.Subscription
	ingressSem   chan struct{}
	ingressWG    sync.WaitGroup
	ingressCount atomic.Int64
	svc          micro.Service
	draining     atomic.Bool
	stopOnce     sync.Once
	ingressOnce  sync.Once
}

// NewNode validates cfg and builds a node; register hub kinds with
// [Node.Register], then call [Node.Start]. opts tune the sending side.
// Errors match [ErrInvalidConfig] or hub.ErrInvalidConfig.
func NewNode(cfg NodeConfig, opts ...Option) (*Node, error) {
	if cfg.Generation == 0 {
		cfg.Generation = uint64(time.Now().UnixNano())
	}
	id := subjects.NodeID{Name: cfg.Name, Generation: cfg.Generation}
	if err := id.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Prefix == "" {
		cfg.Prefix = subjects.DefaultPrefix
	}
	if cfg.IngressConcurrency <= 0 {
		cfg.IngressConcurrency = DefaultIngressConcurrency
	}
	hc := cfg.Host
	hc.Conn, hc.Node, hc.Prefix, hc.Logger = cfg.Conn, id, cfg.Prefix, cfg.Logger
	h, err := hub.New(hc)
	if err != nil {
		return nil, err
	}
	if cfg.Resolver == nil {
		cfg.Resolver = StaticResolver{Node: id}
	}
	c, err := NewClient(Config{Conn: cfg.Conn, Resolver: cfg.Resolver, Identity: id, Prefix: cfg.Prefix},
		append([]Option{WithLogger(cfg.Logger)}, opts...)...)
	if err != nil {
		return nil, err
	}
	return &Node{
		Client: c, cfg: cfg, host: h, id: id, conn: cfg.Conn, prefix: cfg.Prefix,
		log: cfg.Logger.With("node", id.String()), started: time.Now(),
		ingressSem: make(chan struct{}, cfg.IngressConcurrency),
	}, nil
}

// ID returns the node generation.
func (n *Node) ID() subjects.NodeID { return n.id }

// Host returns the receiving side.
func (n *Node) Host() *hub.Host { return n.host }

// Register installs the hub factory for an address kind.
func (n *Node) Register(kind string, f hub.Factory) error { return n.host.Register(kind, f) }

// Start subscribes the node's delivery subject, then (unless disabled) the
// ingress and the control service. On error everything started is stopped.
func (n *Node) Start() error {
	if err := n.host.Start(); err != nil {
		return err
	}
	if !n.cfg.DisableIngress {
		if err := n.serveIngress(); err != nil {
			n.Close()
			return fmt.Errorf("mesh: ingress: %w", err)
		}
	}
	if !n.cfg.DisableControl {
		if err := n.serveControl(); err != nil {
			n.Close()
			return fmt.Errorf("mesh: control service: %w", err)
		}
	}
	return n.conn.Flush()
}

// Drain stops taking ingress and control requests, refuses new deliveries
// ShuttingDown, settles the accepted ones (handled, or failed late with
// ShuttingDown once ctx ends), waits for forwarded ingress deliveries and
// closes the client. It does not close the NATS connection, which the caller
// owns. It returns ctx's error if ctx ended before everything settled. Safe
// to call more than once.
func (n *Node) Drain(ctx context.Context) error {
	n.draining.Store(true)
	n.stopIngress()
	err := n.host.Drain(ctx)
	n.ingressWG.Wait()
	n.Client.Close()
	n.stopServing() // the control service reports "draining" until here
	return err
}

// Close stops the node at once: queued deliveries fail late with
// ShuttingDown. Safe to call more than once.
func (n *Node) Close() error {
	n.draining.Store(true)
	n.stopServing()
	n.host.Close()
	n.Client.Close()
	n.ingressWG.Wait()
	return nil
}

func (n *Node) stopIngress() {
	n.ingressOnce.Do(func() {
		if n.ingressSub != nil {
			_ = n.ingressSub.Unsubscribe()
		}
	})
}

func (n *Node) stopServing() {
	n.stopIngress()
	n.stopOnce.Do(func() {
		if n.svc != nil {
			_ = n.svc.Stop()
		}
	})
}
