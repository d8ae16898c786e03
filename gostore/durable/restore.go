package durable

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/keygroup"
	"github.com/millpond/millpond/gostore/localstore"
	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// Resume kinds.
const (
	ResumeFresh = "fresh" // nothing committed: start at epoch 1
	ResumeFast  = "fast"  // the local store was current: read locally
	ResumeFull  = "full"  // rebuilt from the durable store
)

// RestoreInfo says how a worker's state came back.
type RestoreInfo struct {
	Kind    string `json:"kind"`
	Reason  string `json:"reason"`
	Objects int    `json:"objects"`
	Bytes   int64  `json:"bytes"`
	Rows    int64  `json:"rows"`
	// Keys is the live keys restored, or -1 when the store may still hold
	// older versions of keys that local GC has not collected (Rows counts
	// them too).
	Keys    int64   `json:"keys"`
	Seconds float64 `json:"seconds"`
}

// Progress counts a full resume's downloads, for progress bars. All fields
// are updated atomically.
type Progress struct {
	ObjectsTotal atomic.Int64
	ObjectsDone  atomic.Int64
	BytesTotal   atomic.Int64
	BytesDone    atomic.Int64
	// RowsTotal is the rows of the objects being merged (older versions
	// included); RowsRestored, the newest rows written so far.
	RowsTotal    atomic.Int64
	RowsRestored atomic.Int64
}

// Progress returns the run's restore counters.
func (r *Run) Progress() *Progress { return &r.progress }

// Restore opens worker w's local store at the resume epoch: as it is when
// it is current (fast resume), rebuilt from the durable store otherwise
// (full resume: a missing, stale, damaged or differently laid out store).
//
// In cluster mode w is a global index and must be hosted by this process.
func (r *Run) Restore(ctx context.Context, w int) (RestoreInfo, error) {
	if err := r.checkHosted(w); err != nil {
		return RestoreInfo{}, fmt.Errorf("restore worker: %w", err)
	}
	if r.stores[w] != nil {
		return RestoreInfo{}, fmt.Errorf("restore worker %d: restored already", w)
	}
	start := time.Now()
	cfg := localstore.Config{
		Dir: r.cfg.LocalDir, FlowID: r.cfg.FlowID, WorkerIndex: w, WorkerCount: r.cfg.WorkerCount,
		KeyGroupCount: r.cfg.KeyGroupCount, Execution: r.execution,
		GenerationMinRows: r.cfg.GenerationMinRows,
	}
	committed := r.state.Commit.Epoch
	info := RestoreInfo{Kind: ResumeFull}
	marker := filepath.Join(localstore.WorkerDir(r.cfg.LocalDir, r.cfg.FlowID, w), rebuildMarker)
	settleErr := error(nil)
	if committed > 0 {
		// A generation the last run left waiting is kept or dropped by
		// whether its epoch committed, before the store is judged.
		settleErr = localstore.Settle(ctx, r.cfg.LocalDir, r.cfg.FlowID, w, r.resume)
	}
	if committed == 0 {
		info.Kind, info.Reason = ResumeFresh, "nothing committed yet"
	} else if reason, damaged := localstore.Damaged(r.cfg.LocalDir, r.cfg.FlowID, w); damaged {
		info.Reason = damagedReason(reason)
	} else if settleErr != nil {
		info.Reason = unusableReason(settleErr)
	} else if _, err := os.Stat(marker); err == nil {
		info.Reason = "an earlier rebuild of the local store did not finish"
	} else if meta, err := localstore.Inspect(ctx, r.cfg.LocalDir, r.cfg.FlowID, w); err != nil {
		info.Reason = unusableReason(err)
		if errors.Is(err, os.ErrNotExist) {
			info.Reason = "no local store"
		}
	} else {
		switch {
		case meta.FlowID != r.cfg.FlowID || meta.KeyGroupCount != r.cfg.KeyGroupCount:
			info.Reason = "local store belongs to another flow or key-group count"
		case meta.WorkerCount != r.cfg.WorkerCount || meta.WorkerIndex != w:
			info.Reason = fmt.Sprintf("worker count changed from %d to %d", meta.WorkerCount, r.cfg.WorkerCount)
		case meta.LastEpoch < committed:
			info.Reason = fmt.Sprintf("local store holds epochs up to %d, committed is %d", meta.LastEpoch, committed)
		case meta.Execution < r.state.Commit.Execution:
			// Executions run one after another: a store last opened before
			// the execution that wrote the newest commit missed that
			// execution's epochs, and rows it holds past its own last
			// commit were never committed (another machine committed
			// those epochs with other rows).
			info.Reason = fmt.Sprintf("local store was last opened by execution %d, before execution %d that wrote the newest commit",
				meta.Execution, r.state.Commit.Execution)
		case meta.GCEpoch > committed:
			info.Reason = fmt.Sprintf("local store was collected up to epoch %d, past the committed %d", meta.GCEpoch, committed)
		default:
			info.Kind, info.Reason = ResumeFast, "local store is current"
		}
	}
	var store *localstore.Store
	if info.Kind == ResumeFast {
		// Opening rolls back uncommitted epochs and counting reads the
		// whole index: either can find the file damaged (or written
		// before rows had checksums), and then the store is rebuilt.
		var err error
		if store, err = r.openFast(ctx, cfg, &info); err != nil {
			if !errors.Is(err, localstore.ErrDamaged) && !errors.Is(err, localstore.ErrLayoutChanged) {
				return info, err
			}
			info.Kind, info.Reason = ResumeFull, unusableReason(err)
		}
	}
	if info.Kind != ResumeFast {
		if err := localstore.Remove(r.cfg.LocalDir, r.cfg.FlowID, w); err != nil {
			return info, err
		}
		var err error
		if store, err = localstore.Open(ctx, cfg, r.resume); err != nil {
			return info, err
		}
	}
	if info.Kind == ResumeFull {
		// Rows restored so far can already reach the committed epoch; the
		// marker keeps a store whose rebuild was killed from passing for
		// current.
		if err := writeMarker(marker); err != nil {
			store.Close()
			return info, err
		}
		if err := r.rebuild(ctx, w, store, &info); err != nil {
			store.Close()
			localstore.Remove(r.cfg.LocalDir, r.cfg.FlowID, w)
			return info, err
		}
		if err := os.Remove(marker); err != nil {
			store.Close()
			return info, fmt.Errorf("finish rebuild of worker %d: %w", w, err)
		}
	}
	// Rows minus deletions are the keys when the store holds one row per
	// key: rebuilt from the backup, or collected through the committed
	// epoch. A store a run left uncollected (local GC runs in the
	// background once the next run starts, rather than holding up its
	// resume) may still hold older versions of some keys: its key count is
	// not known without reading every row.
	if info.Kind != ResumeFast {
		if st, err := store.Stats(ctx); err == nil {
			info.Rows, info.Keys = st.Rows-st.Deletions, st.Rows-st.Deletions
		}
	}
	info.Seconds = time.Since(start).Seconds()
	r.stores[w] = store
	r.restores[w] = info
	if r.cfg.Mode == SnapshotBatch {
		// A fresh worker's state is empty, so it is carried from the
		// start; a resumed one's from its first whole batch.
		r.carry[w] = newCarried(info.Kind == ResumeFresh, r.cfg.CarryBytes)
	}
	// A full resume says why at Info (the local store was lost, the worker
	// count changed...); the others are routine.
	level := slog.LevelDebug
	if info.Kind == ResumeFull {
		level = slog.LevelInfo
	}
	r.cfg.Logger.Log(ctx, level, "worker restored", "flow", r.cfg.FlowID, "worker", w, "kind", info.Kind,
		"reason", info.Reason, "objects", info.Objects, "bytes", info.Bytes, "seconds", info.Seconds)
	return info, nil
}

// openFast opens a current local store for a fast resume and counts its
// rows. A store that turns out damaged is closed (and marked, so no later
// run trusts it) and the error returned.
func (r *Run) openFast(ctx context.Context, cfg localstore.Config, info *RestoreInfo) (*localstore.Store, error) {
	store, err := localstore.Open(ctx, cfg, r.resume)
	if err != nil {
		return nil, err
	}
	st, err := store.Stats(ctx)
	if err != nil {
		store.Close()
		return nil, err
	}
	info.Rows = st.Rows - st.Deletions
	info.Keys = -1
	if store.Meta().GCEpoch >= r.state.Commit.Epoch {
		info.Keys = info.Rows
	}
	return store, nil
}

// damagedReason is the resume reason of a store an earlier run found
// damaged.
func damagedReason(reason string) string {
	if strings.HasPrefix(reason, "local store damaged") {
		return reason
	}
	return "local store damaged: " + reason
}

// unusableReason is the resume reason of a store that cannot be opened or
// judged: damaged, or something else wrong with it.
func unusableReason(err error) string {
	if errors.Is(err, localstore.ErrDamaged) {
		return localstore.DamageReason(err)
	}
	return fmt.Sprintf("no usable local store (%v)", err)
}

// rebuild fills a fresh local store with the state of worker w's key
// groups at the newest commit: it downloads and checks every object that
// holds some of them, then merges them into the newest row per key.
func (r *Run) rebuild(ctx context.Context, w int, store *localstore.Store, info *RestoreInfo) error {
	owned := keygroup.OwnedBy(w, r.cfg.WorkerCount, r.cfg.KeyGroupCount)
	var refs []ObjectRef
	for _, o := range r.state.Commit.Objects {
		if o.GroupLo < owned.Hi && owned.Lo < o.GroupHi {
			refs = append(refs, o)
			r.progress.ObjectsTotal.Add(1)
			r.progress.BytesTotal.Add(o.Size)
			r.progress.RowsTotal.Add(o.Rows)
		}
	}
	tmp := filepath.Join(r.cfg.LocalDir, r.cfg.FlowID, fmt.Sprintf("worker-%04d", w), "restore")
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	committed := r.state.Commit.Epoch
	objs := make([]*objectRows, 0, len(refs))
	defer func() {
		for _, o := range objs {
			o.f.Close()
		}
	}()
	for i, o := range refs {
		path := filepath.Join(tmp, fmt.Sprintf("%06d.sqlite", i))
		if err := fetchObject(ctx, r.cfg.Backup, o, path); err != nil {
			return r.objectHint(err)
		}
		f, err := openObject(ctx, o, path, r.cfg)
		if err != nil {
			return r.objectHint(err)
		}
		objs = append(objs, &objectRows{name: o.Key, f: f, opts: snapfile.ScanOptions{
			Groups: &owned, IncludeDeleted: true, Before: committed + 1, ChunkRows: 8192,
		}})
		info.Objects++
		info.Bytes += o.Size
		r.progress.ObjectsDone.Add(1)
		r.progress.BytesDone.Add(o.Size)
	}
	err := mergeNewest(ctx, objs, 8192, func(rows []rowbatch.Row) error {
		n, err := store.Restore(ctx, rows)
		r.progress.RowsRestored.Add(int64(n))
		return err
	})
	if err != nil {
		return fmt.Errorf("restore worker %d: %w", w, err)
	}
	// One row per key, none superseded: collected through committed.
	return store.MarkRebuilt(ctx, committed)
}

// objectHint adds to an error about a committed object what the operator
// can do: the object cannot be read, so either it comes back, or the flow
// resumes from a commit that does not name it.
func (r *Run) objectHint(err error) error {
	switch {
	case errors.Is(err, ErrCorrupt):
		return fmt.Errorf("%w. The commit record of epoch %d names it: restore it from a copy of the backup; or delete %s (and any newer commit record) and the local state directory %s to resume from an older commit, if one does not name it",
			err, r.state.Commit.Epoch, commitKey(r.cfg.FlowID, r.state.Commit.Epoch), filepath.Join(r.cfg.LocalDir, r.cfg.FlowID))
	case errors.Is(err, backup.ErrNotFound):
		return fmt.Errorf("%w: %w; the commit record of epoch %d names it. Restore it from a copy of the backup; or delete %s (and any newer commit record) and the local state directory %s to resume from an older commit, if one does not name it",
			ErrObjectsLost, err, r.state.Commit.Epoch, commitKey(r.cfg.FlowID, r.state.Commit.Epoch), filepath.Join(r.cfg.LocalDir, r.cfg.FlowID))
	}
	return err
}

// openObject opens a downloaded object and checks that it belongs to the
// flow and key-group layout being restored.
func openObject(ctx context.Context, o ObjectRef, path string, cfg Config) (*snapfile.File, error) {
	f, err := snapfile.Open(ctx, path, snapfile.Options{Segment: true})
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, o.Key, err)
	}
	if m := f.Meta(); m.FlowID != cfg.FlowID || m.KeyGroupCount != cfg.KeyGroupCount {
		f.Close()
		return nil, fmt.Errorf("%w: %s holds flow %q with %d key groups, not %q with %d", ErrCorrupt, o.Key, m.FlowID, m.KeyGroupCount, cfg.FlowID, cfg.KeyGroupCount)
	}
	return f, nil
}

// rebuildMarker is a file in a worker's directory while its local store
// is being rebuilt from the durable store.
const rebuildMarker = "REBUILDING"

func writeMarker(path string) error {
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		return fmt.Errorf("mark rebuild: %w", err)
	}
	return backup.SyncDir(filepath.Dir(path))
}
