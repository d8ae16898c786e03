// Package durable is the durable half of recovery: it ships finished
// segments to a backup, writes commit records once every worker's segments
// of an epoch are uploaded, computes the resume point from the backup
// alone, rebuilds local stores from it, and keeps it bounded by compaction
// and garbage collection.
//
// Everything of a flow lives under the key prefix "<flow_id>/":
//
//	<flow>/executions/<exec>.json           one per run, written before it processes anything
//	<flow>/segments/<exec>/w<worker>-e<epoch>-s<seq>.sqlite   a worker's rows of one epoch (or batch)
//	<flow>/compacted/<epoch>-x<exec>-w<worker>of<count>.sqlite  a worker's whole state at an epoch
//	<flow>/commits/<epoch>.json             the objects that make up the state at a committed epoch
//
// A commit record names every object of its state with its checksum, row
// count, epochs and key-group range, so a reader needs nothing but the
// newest record, and compaction switches state atomically by writing a
// record that names the compacted objects instead of the segments.
//
// The files, one concept each: run.go (Config, Open, Start, Finish: a
// run's life), pipeline.go (Write, the segment cutters and the uploads),
// whole.go (epochs whose batches are every worker's whole state),
// commit.go (closing epochs, commit records), heal.go (the listing before
// a commit: fencing off older executions, rebuilding lost objects),
// metrics.go, restore.go (fast and full resume), verify.go (the check of
// a fast-resumed local store that commits wait for), lost.go (a backup
// that lost committed state), merge.go (newest row per key across
// objects), maintain.go (the background round), compact.go and gc.go (its
// two durable jobs), record.go, seal.go and state.go (commit and execution
// records, their seal, and creating them), inspect.go (inspect and
// verify), layout.go (object keys), encoding.go (objects stored as zstd,
// checked as stored before they are decoded); for a flow run as several processes,
// cluster.go (the Cluster interface, the messages, the inbox reader),
// agree.go (the agreement at start), leader.go and follower.go (the two
// sides of commits, compactions and the end of a run).
//
// # Cluster mode
//
// With Config.Cluster set, a run is one process of a flow that runs as
// several. Process p hosts workers FirstWorker..FirstWorker+Workers-1 of
// WorkerCount (global indexes: every method taking a worker takes one,
// and refuses a worker not hosted here), with its own local directory and
// local stores; every process reaches the same backup. Process 0 leads.
// The processes exchange small versioned JSON messages ("v": 2, a "type",
// and the execution, which must be this run's: "fenced out" otherwise);
// an unknown or malformed message fails the run.
//
//   - Open: the leader reads the durable state as a run of its own does
//     and sends `agree` (execution, resume and committed epoch, flow,
//     worker and key-group counts, processes) to every follower. A
//     follower reads the state too (its local stores must not have seen
//     commits the backup lacks), waits for `agree` (StartTimeout), refuses
//     another committed epoch ("every process must use the same backup")
//     or other settings, and takes the leader's execution and resume epoch.
//   - Restore: each process restores its own workers, fast or full (a
//     full resume rebuilds a worker's key groups for the current layout
//     from objects written under any earlier one).
//   - Start: a follower sends `ready` (its workers); the leader waits for
//     every follower's, checks that they are all the workers once each,
//     records the execution and sends `started`, which a follower waits
//     for. Nothing is processed or uploaded before the record exists.
//   - Commits: each process uploads its workers' segments. A follower
//     sends `uploaded` (epoch, segments) for each epoch in order, once its
//     workers closed it, its uploads finished and its fast-resumed stores
//     passed their check. The leader counts that follower's workers closed
//     with those segments, commits as a run of its own does (listing,
//     fencing and missing-object checks; never once the cluster failed),
//     and sends every record it writes as `committed`: a follower applies
//     it as a commit of its own (committed epoch, local stores told, local
//     GC, back-pressure in CloseEpoch).
//   - Whole-state epochs: a follower's `uploaded` names its workers whose
//     batch of the epoch was whole (and those that cut no segment); the
//     leader promotes an epoch whole on every worker of every process to
//     compacted state, as a run of its own does. A whole batch keeps its
//     deletions (they are cut before the leader knows; compacted state
//     skips them), and the local store that adopts its segment's copy as
//     a generation drops them (the segment counts them).
//   - Compaction and heal: the leader alone decides. It sends `compact`
//     (epoch, heal, variant, round) and compacts its own workers; each
//     follower compacts its workers at that committed epoch (it has the
//     commit: messages are in order) and answers `compacted` (objects) or
//     `compact_failed` (the leader logs it and retries later; at debug
//     level when the follower finished, or when a whole-state generation
//     of a later epoch had already replaced that epoch's state in one of
//     its local stores, localstore.ErrReplaced: neither is a fault). The leader's
//     record names every process's compacted objects in place of all
//     objects up to that epoch, and goes out as `committed`. Commits of new
//     epochs go on meanwhile.
//   - Durable GC runs on the leader only; local GC on every process.
//   - Finish: a follower reports its last epochs, sends `finish` (its last
//     reported epoch) and, unless aborted, waits until that epoch is
//     committed. The leader, unless aborted, waits for every follower's
//     `finish`, then for the commit of every epoch all workers closed, and
//     sends `finished`; a follower still running when it arrives fails.
//     Once the leader commits nothing more for it, a follower stops its
//     part in compactions (the one in progress is stopped and answered
//     `compact_failed` with "finished"; later requests too) and sends
//     `stopped`. The leader waits for every follower's `stopped` (at most
//     10 s) before its last durable GC, so that no follower uploads a
//     compacted object after that GC looked: an object of a round given
//     up is collected by this run, not left to the next one.
//   - Failure: a run that fails or is closed before it finished sends
//     `failed` (a follower to the leader, the leader to every follower),
//     and the receiver fails at once; so does a run whose cluster stops
//     (its inbox closes, a send fails). Every wait then returns.
package durable
