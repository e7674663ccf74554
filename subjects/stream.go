package subjects

// StreamIdentity returns the identity under which a delivery sent on stream
// s shares a stream with other deliveries to the same address. It is the one
// function through which both keys that care read it (DESIGN §5): the
// sender's lane key (package mesh: one ordered lane, up to a window of legs
// in flight, per address and stream identity) and the hub's storm-breaker key (package hub: one per-second
// counter per sender, target, type and stream identity).
//
// Today the identity is the stream itself. The empty stream is not "no
// stream": it is the destination-wide stream, one identity like any other,
// so all deliveries sent without a stream share one lane and one breaker
// counter.
//
// It is one function so that the two keys can never disagree about which
// deliveries share a stream: were the breaker to split what the sender
// orders on one lane, a sender could evade it; were it to merge what the
// sender keeps on separate lanes, independent streams would trip it
// together. Any future normalisation of stream identity belongs here, and
// only here.
func StreamIdentity(s Stream) Stream { return s }
