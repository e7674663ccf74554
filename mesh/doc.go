// Package mesh is the sending side of natsmesh and the Node that composes a
// mesh process (DESIGN §4–§6).
//
// A [Node] hosts hub kinds (package hub) at addresses "kind/id" and sends
// deliveries to any address in the mesh over one NATS connection. Register
// the kinds, then Start; Drain (or Close) ends it:
//
//	node, err := mesh.NewNode(mesh.NodeConfig{Conn: nc, Name: "orders"})
//	node.Register("order", orderFactory)       // one activation per address
//	err = node.Start()
//	r, err := node.Deliver(ctx, mesh.Delivery{To: "order/42", Payload: b})
//	resp, err := node.Request(ctx, mesh.Delivery{To: "order/42", Type: "get"})
//	err = node.Drain(ctx)
//
// Without [NodeConfig].Membership the node is a one-node mesh: it owns every
// address it is sent. With a [MembershipConfig] it joins the mesh's node
// registry and address directory (JetStream KV on the NATS account): each
// address has one activation in the whole mesh, placed on a live node that
// hosts its kind, and everything in flight to a node that departs fails at
// once instead of at its timeout.
//
// # Sending
//
// [Client.Deliver] (and [Node.Deliver]) returns once a hub accepted the
// delivery — it is in that activation's inbox, not yet handled — with a
// [Receipt] naming the accepting node generation. [Client.Request] also
// waits for the handler's response. Deliveries with the same (To, Stream)
// form a lane: they are sent and handled in call order, up to a window of
// 32 legs in flight per lane ([WithWindow]; the intake checks each lane's
// sequence, docs/protocol.md §3.4); different lanes run concurrently.
// Deliver blocks while the lane's window is full or an earlier delivery of
// it is retrying, while the cap on legs in flight (default 256) is reached,
// or during a retry back-off; ctx bounds
// all of it, and a ctx without deadline gets the request timeout (30 s).
// Clients and Nodes are safe for concurrent use.
//
// # Errors
//
// Every failure is a verdict error (package verdict): read it with
// verdict.IsResendable (the hub holds nothing: safe to send again),
// verdict.IsTransient (another attempt is conceivable; a timeout is
// transient but not resendable — the hub may hold it) and verdict.Classify.
// Only resendable failures are retried, by the client itself: 6 retries
// from 250 ms doubling to 3 s ([DefaultRetryPolicy]), re-resolving the
// owner each time; a kind no live node hosts is retried only for the
// placement wait (1 s, [WithPlacementWait]) and then fails Unavailable
// (verdict.ErrNoPlacement). A leg timeout is returned at once and never
// re-sent. Invalid input (address, stream, ID, payload over max_payload)
// fails before anything is sent.
//
// # Receiving
//
// A hub kind is a hub.Factory: called once per address activation, it
// returns the hub whose handler runs one delivery at a time, in acceptance
// order. The node's ingress (<prefix>.in.<addr>.<stream>) lets any NATS
// client deliver without this package (docs/protocol.md), and its control
// endpoints make it a NATS micro service (`nats micro ls`).
package mesh
