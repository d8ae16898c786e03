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
// verify), layout.go (object keys).
package durable
