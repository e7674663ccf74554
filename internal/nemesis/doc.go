// Package nemesis holds the pure parts of the mesh's generated-fault
// verification (DESIGN §11, issue 21): a history model of everything a run
// did, checkers that judge a whole history, and a fault schedule generated
// from a seed.
//
// A run (integration.TestNemesis) records every operation a workload made
// — its invoke and completion times, its verdict, delivery ID, lane and
// per-lane sequence number — and, from the node processes, the start and
// end of every handler turn with the node generation and activation that
// ran it. After the run each checker reads the [History] and returns a
// [Finding]: the [Violation]s, and apart from them what it excused — the
// windows the design documents rather than promises away (a turn frozen
// mid-way by a process pause; a delivery run by a node before it noticed
// its link was cut, whose answer was lost):
//
//   - [CheckSingleActivation]: no two turns of one address overlap in time.
//   - [CheckLaneOrder]: within a lane the handlers saw accepted deliveries
//     in the caller's order.
//   - [CheckAtMostOnce]: a delivery answered Accepted ran at most once; a
//     delivery answered with a resendable verdict never ran.
//   - [CheckTimeoutNotResent]: a timed-out delivery was never sent again.
//   - [CheckOneVerdict]: every delivery got exactly one final verdict.
//   - [CheckKV]: the kv operations on each address are linearizable
//     (Porcupine); a failing partition is written as Porcupine's HTML
//     visualization.
//   - [CheckDurable]: acknowledged durable writes survive the loss of
//     every node (read back after the run).
//   - [CheckStreams]: every sync-stream subscription converged to its
//     owner's state after the faults stopped, and none ended.
//
// Checkers are pure functions of the history: they run the same on a
// history recorded a minute ago, on one read back from a file ([ReadJSON]),
// and on the hand-made histories of their unit tests.
//
// [Generate] turns a seed into a [Schedule] of faults (node SIGKILL,
// SIGSTOP/SIGCONT past the fencing delay, a NATS server's lame-duck restart,
// a server SIGKILL and restart, stream-leader kills, link cuts and slow
// links, a node joining and draining); the same seed yields the same
// schedule. Applying it to processes is the harness's job (package
// integration), so this package imports nothing of the harness.
package nemesis
