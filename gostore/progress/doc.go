// Package progress decides when an epoch (phase) may close across the
// processes of a cluster: when every process is ready and no data message is
// in flight anywhere, even though messages cause messages.
//
// # Model
//
// Each process's driver loop (one thread) alternates activations with calls
// to [Tracker.Report], so every Report is taken at a quiescent point: no
// activation is running, and every data message counted as Received has been
// processed. Sent and Received are cumulative counts of data messages to and
// from other processes. Once a process reports Ready for (Epoch, Phase) it is
// passive for that (Epoch, Phase): it no longer polls sources nor fires
// timers, and only processes data messages it receives (which may send more).
// Keys (Epoch, Phase) are ordered lexicographically; every process goes
// through the same keys, and moves past a key only once its decision is
// known.
//
// A faster process may already send data of the next epoch while a slower
// one has not learned the decision yet. The receiver must keep such a
// message, uncounted, until it reaches that epoch itself: the protocol sees
// it as in flight meanwhile, which it is for the epoch it belongs to.
//
// # Protocol (Mattern's four-counter method, waves led by process 0)
//
//   - Process 0, the leader, starts wave 1 of key k when it first reports k:
//     it sends Probe(k, 1) to every other process.
//   - A process answers the probe of wave w only from inside Report, when it
//     reports k with Ready: Reply(k, w, Sent, Received, Done) to the leader.
//     A probe for a key the process has not reported yet is kept until it
//     does. The leader records its own reply the same way (no message).
//   - When all n replies of wave w are in, the leader decides k if wave w-1
//     exists, every process's (Sent, Received) in wave w equals its pair in
//     wave w-1, and the wave's total Sent equals its total Received. It then
//     sends Decision(k, Done) to every other process, where Done is the
//     intersection of the replies' Done sets. Otherwise it starts wave w+1 at
//     once (its own reply to the new wave may be taken at the same point).
//   - Control messages travel FIFO per pair, so decisions arrive in order and
//     every probe of key k arrives after the decision of the key before it.
//
// With count == 1 the leader is alone: its first Ready report completes
// wave 1 and its reply to wave 2 is taken at the same quiescent point, so a
// single Ready report with Sent == Received decides.
//
// # Why a decision is safe (proof sketch)
//
// Waves do not overlap: the probes of wave w+1 are sent only after the
// leader holds every reply of wave w. Let T be the instant wave w was
// complete (the leader held its last reply). Every process i sent its wave-w
// reply at some t_i <= T and its wave-(w+1) reply at some t'_i >= T (it
// answers a probe sent at or after T; the leader's own reply may be taken at
// T itself). Counters never decrease and each process reported the same
// (Sent_i, Received_i) at t_i and t'_i, so at instant T every counter had
// its reported value. Every message counted as received was sent, so total
// Sent == total Received at T means the set of messages sent by T equals the
// set received by T: nothing was in flight at T. Every message taken by T
// was also processed by T: a process took none between its two replies,
// and each reply is at a quiescent point. Every process was ready (hence
// passive) from t_i <= T on. A passive process only sends while it
// processes a received message, and there is none to receive, so from T on
// no process sends again for key k: the state at T is final and the
// decision is correct. (The same argument with a single wave fails: a
// process may receive and send after its reply, and a message received and
// counted by a later replier can hide one still in flight; the tests keep a
// variant that decides after one wave to show the simulation catches it.)
//
// Liveness: once every process is ready and nothing is in flight, counters
// stop changing, so two consecutive complete waves carry identical counters
// with equal totals. An epoch with no cross-process traffic therefore
// decides with two waves, as soon as every process has reported Ready.
//
// # Messages
//
// Control payloads are small binary messages: a version byte, a kind byte
// and uvarint fields (see wire.go). A malformed message, or one that cannot
// occur in a correct run (a reply at a non-leader, a second probe while one
// is unanswered, a decision for a key this process never reported), makes
// Deliver return an error; the caller fails the cluster with it. Messages of
// keys at or before the last decision known here are stale and ignored.
// After any error, every later call returns the first error.
package progress
