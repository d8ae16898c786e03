package durable_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/durable"
	"github.com/millpond/millpond/gostore/internal/testlog"
	"github.com/millpond/millpond/gostore/rowbatch"
)

// compactionBlocker holds every upload of a compacted object until gate
// closes or the upload's context ends.
type compactionBlocker struct {
	backup.Backup
	gate    chan struct{}
	waiting atomic.Int32
}

func (b *compactionBlocker) Upload(ctx context.Context, path, key string) error {
	if strings.Contains(key, "/compacted/") {
		b.waiting.Add(1)
		select {
		case <-b.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return b.Backup.Upload(ctx, path, key)
}

// within runs f in the background and fails the test if it has not
// returned after waitFor.
func within(t *testing.T, what string, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		require.NoError(t, err, what)
	case <-time.After(waitFor):
		t.Fatalf("%s waited for a compaction that cannot finish", what)
	}
}

// The run's last epoch closes without waiting for maintenance, and Finish
// neither waits for a compaction in flight nor starts one: the run ends as
// soon as its last epoch is committed, and its state restores completely
// from the segments left.
func TestRunEndsWithoutWaitingForCompaction(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	bb := &compactionBlocker{Backup: h.bk, gate: make(chan struct{})}
	defer func() {
		select {
		case <-bb.gate:
		default:
			close(bb.gate)
		}
	}()
	run, _ := h.open(h.config(1, func(c *durable.Config) { c.Backup = bb; c.CompactMinBytes = 1 }))
	g := updatesGen(300, 1, false) // every key in every epoch: compaction is due after each commit
	require.NoError(t, h.epoch(run, 1, 1, g(1)))
	require.Eventually(t, func() bool { return bb.waiting.Load() > 0 }, waitFor, tick, "the compaction after epoch 1 starts")

	rows := g(2)
	_, err := run.Write(ctx, 0, rowbatch.NewBatch(2, rows, false))
	require.NoError(t, err)
	within(t, "CloseLastEpoch", func() error { return run.CloseLastEpoch(0, 2) })
	h.m.apply(rows)
	within(t, "Finish", func() error { return run.Finish(false) })
	assert.Equal(t, int64(2), run.Committed())
	assert.Zero(t, run.Metrics().Compactions)
	require.NoError(t, run.Close())
	assert.Empty(t, list(t, h.bk, "compacted/"), "no compaction finished")

	h.wipeLocal()
	run, infos := h.open(h.config(1))
	assert.Equal(t, []string{durable.ResumeFull}, kinds(infos))
	assert.Equal(t, int64(3), run.ResumeEpoch())
	requireModel(t, h.m, stateOf(t, run, 1, h.kgc))
}

// Before the last epoch, a close does wait while compaction is behind
// (the bound on the durable footprint of a run that goes on).
func TestCloseEpochWaitsForCompactionThatIsBehind(t *testing.T) {
	h := newHarness(t)
	bb := &compactionBlocker{Backup: h.bk, gate: make(chan struct{})}
	run, _ := h.open(h.config(1, func(c *durable.Config) { c.Backup = bb; c.CompactMinBytes = 1 }))
	g := updatesGen(300, 1, false)
	require.NoError(t, h.epoch(run, 1, 1, g(1)))
	require.Eventually(t, func() bool { return bb.waiting.Load() > 0 }, waitFor, tick)
	closed := make(chan error, 1)
	go func() { closed <- h.epoch(run, 1, 2, g(2)) }()
	select {
	case err := <-closed:
		t.Fatalf("epoch 2 closed (err %v) while the compaction it must wait for was blocked", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(bb.gate)
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(waitFor):
		t.Fatal("epoch 2 never closed after the compaction went through")
	}
	require.NoError(t, run.Finish(false))
	assert.Positive(t, run.Metrics().Compactions)
	assert.Positive(t, run.Metrics().BackpressureSeconds)
}

// A local store's background checkpoint (fsyncs of its WAL and file) waits
// while an epoch is closed but not committed, so it does not compete with
// the segment's own fsyncs; it runs once the epoch commits.
func TestLocalCheckpointsWaitForTheCommit(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	bb := &blockingBackup{Backup: h.bk, gate: make(chan struct{})}
	run, _ := h.open(h.config(1, func(c *durable.Config) {
		c.Backup = bb
		// Held for as long as the test needs, however loaded the machine:
		// the default hold (1s) let the checkpoint run before the check.
		c.CheckpointHold = time.Minute
	}))
	rows := make([]rowbatch.Row, 4000)
	for i := range rows {
		rows[i] = rowbatch.Row{StepID: "s", Key: fmt.Sprintf("k%06d", i), Value: make([]byte, 300)}
	}
	_, err := run.Write(ctx, 0, rowbatch.NewBatch(1, rows, false))
	require.NoError(t, err)
	require.NoError(t, run.CloseEpoch(0, 1))
	h.m.apply(rows)
	wal := run.Store(0).Path() + "-wal"
	walBytes := func() int64 {
		st, err := os.Stat(wal)
		if err != nil {
			return 0
		}
		return st.Size()
	}
	require.Eventually(t, func() bool { return bb.waiting.Load() > 0 }, waitFor, tick)
	require.NoError(t, run.Store(0).Flush())
	time.Sleep(100 * time.Millisecond)
	assert.Positive(t, walBytes(), "the local write is done and its checkpoint due, but the epoch is not committed")
	close(bb.gate)
	require.Eventually(t, func() bool { return run.Committed() == 1 && walBytes() == 0 }, waitFor, tick,
		"once the epoch commits, the checkpoint runs")
	require.NoError(t, run.Finish(false))
	requireModel(t, h.m, stateOf(t, run, 1, h.kgc))
}

// lateCompactions delays every upload of a compacted object by delay and
// then makes it whatever the caller's context says: an upload whose
// bytes were all sent lands although its caller gave up on it.
type lateCompactions struct {
	backup.Backup
	delay   time.Duration
	started atomic.Int32
}

func (b *lateCompactions) Upload(ctx context.Context, path, key string) error {
	if strings.Contains(key, "/compacted/") {
		b.started.Add(1)
		time.Sleep(b.delay)
		return b.Backup.Upload(context.Background(), path, key)
	}
	return b.Backup.Upload(ctx, path, key)
}

// A cluster that finishes while its followers are compacting leaves no
// compacted object that no record names: each follower stops its part
// (and answers) before it tells the leader it finished, and the leader's
// last GC comes after every follower finished. The state then restores
// exactly, on another layout too.
func TestClusterFinishDuringCompactionLeavesNoGarbage(t *testing.T) {
	h := newClusterHarness(t)
	g := updatesGen(300, 1, false) // every key in every epoch: compaction is due after each commit
	late := &lateCompactions{Backup: h.bk, delay: 400 * time.Millisecond}
	procs, _ := h.start(3, 1, false, func(c *durable.Config) {
		c.CompactMinBytes, c.RetainEpochs = 1, 1
		if c.Cluster.Index() > 0 {
			c.Backup = late
		}
	})
	// Epochs until one's commit starts a round that the followers'
	// uploads hold up: it is still running when the run finishes.
	inRound := func() bool { return late.started.Load() > 0 && durable.CompactionRunning(procs[0].run) }
	last := int64(0)
	for last < 20 && !inRound() {
		last++
		h.mustEpochs(procs, last, last, g)
		require.Eventually(t, func() bool { return procs[0].run.Committed() == last }, waitFor, tick)
		// Maintenance starts the round after the commit, in its own time.
		for deadline := time.Now().Add(2 * time.Second); !inRound() && time.Now().Before(deadline); {
			time.Sleep(tick)
		}
	}
	require.True(t, inRound(), "a compaction round waits for the followers (uploads started %d, compactions %d, epochs %d)", late.started.Load(), procs[0].run.Metrics().Compactions, last)
	h.finish(procs)
	assert.Equal(t, last, procs[0].run.Committed())
	time.Sleep(2 * late.delay) // any follower upload still on its way lands now
	assertNoGarbage(t, h.bk)
	requireModel(t, h.hist.at[last], readBack(t, h.bk, h.kgc))

	procs, _ = h.start(2, 2, false)
	requireModel(t, h.hist.at[last], clusterState(t, procs, h.kgc))
	h.finish(procs)
}

// A follower whose local store a later whole-state generation already
// replaced cannot compact an older epoch: it says so, and the leader
// retries at a later epoch without warning of a failed compaction (a
// healthy run met it as a warning every few rounds). The run goes on and
// commits as before.
func TestClusterCompactionOfAReplacedEpochIsNoFault(t *testing.T) {
	h := newClusterHarness(t)
	g := updatesGen(300, 1, false)
	late := &lateCompactions{Backup: h.bk, delay: 2 * time.Second}
	logs := &testlog.Buffer{}
	procs, net := h.start(2, 1, false, func(c *durable.Config) {
		c.CompactMinBytes, c.RetainEpochs = 1, 1
		if c.Cluster.Index() > 0 {
			c.Backup = late
		} else {
			c.Logger = logs.Logger()
		}
	})
	last := int64(0)
	for last < 20 && late.started.Load() == 0 {
		last++
		h.mustEpochs(procs, last, last, g)
		require.Eventually(t, func() bool { return procs[0].run.Committed() == last }, waitFor, tick)
		for deadline := time.Now().Add(2 * time.Second); late.started.Load() == 0 && time.Now().Before(deadline); {
			time.Sleep(tick)
		}
	}
	round, epoch := durable.CompactionRound(procs[0].run)
	require.Positive(t, round, "a compaction round waits for the follower")
	net.inject(1, 0, []byte(fmt.Sprintf(`{"v":2,"type":"compact_failed","execution":0,"epoch":%d,"round":%d,"replaced":true,"error":"scan: a whole-state generation replaced that epoch's state"}`, epoch, round)))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "compaction retried at a later epoch") }, waitFor, tick)
	h.mustEpochs(procs, last+1, last+2, g)
	h.finish(procs)
	assert.Equal(t, last+2, procs[0].run.Committed())
	assert.NotContains(t, logs.String(), "durable compaction failed")
	requireModel(t, h.hist.at[last+2], readBack(t, h.bk, h.kgc))
}
