package durable

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/millpond/millpond/gostore/backup"
	"github.com/millpond/millpond/gostore/rowbatch"
	"github.com/millpond/millpond/gostore/snapfile"
)

// FlowReport summarizes a flow's durable data.
type FlowReport struct {
	FlowID         string           `json:"flow_id"`
	Executions     int64            `json:"executions"`
	CommittedEpoch int64            `json:"committed_epoch"`
	CommitEpochs   []int64          `json:"commit_epochs"`
	WorkerCount    int              `json:"worker_count"`
	KeyGroupCount  int              `json:"key_group_count"`
	Objects        int              `json:"objects"`
	ObjectBytes    int64            `json:"object_bytes"`
	Segments       int              `json:"segments"`
	Compacted      int              `json:"compacted"`
	StoredObjects  int              `json:"stored_objects"`
	StoredBytes    int64            `json:"stored_bytes"`
	KeysPerStep    map[string]int64 `json:"keys_per_step,omitempty"`
}

// Inspect reports on a flow's durable data. With keys set it downloads the
// committed objects to count live keys per step.
func Inspect(ctx context.Context, b backup.Backup, flow string, keys bool, k Key) (FlowReport, error) {
	st, err := ReadState(ctx, b, flow, k)
	if err != nil {
		return FlowReport{}, err
	}
	rep := FlowReport{
		FlowID: flow, Executions: st.LastExecution + 1, CommittedEpoch: st.Commit.Epoch,
		CommitEpochs: st.CommitEpochs, WorkerCount: st.Commit.WorkerCount, KeyGroupCount: st.Commit.KeyGroupCount,
		Objects: len(st.Commit.Objects),
	}
	for _, o := range st.Commit.Objects {
		rep.ObjectBytes += o.Size
		if o.Kind == KindCompacted {
			rep.Compacted++
		} else {
			rep.Segments++
		}
	}
	all, err := b.List(ctx, flowPrefix(flow))
	if err != nil {
		return rep, err
	}
	for _, o := range all {
		rep.StoredObjects++
		rep.StoredBytes += o.Size
	}
	if keys && st.Commit.Epoch > 0 {
		counts, err := countKeys(ctx, b, st)
		if err != nil {
			return rep, err
		}
		rep.KeysPerStep = counts
	}
	return rep, nil
}

// countKeys merges the committed objects in a scratch store and counts the
// live keys of each step.
func countKeys(ctx context.Context, b backup.Backup, st State) (map[string]int64, error) {
	dir, err := os.MkdirTemp("", "mp-inspect-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	meta := snapfile.Meta{FlowID: st.FlowID, Kind: snapfile.KindLocal, WorkerCount: 1, KeyGroupCount: st.Commit.KeyGroupCount}
	merged, err := snapfile.Create(ctx, filepath.Join(dir, "merged.sqlite"), meta, snapfile.Options{Segment: true})
	if err != nil {
		return nil, err
	}
	defer merged.Close()
	objs := append([]ObjectRef(nil), st.Commit.Objects...)
	sortObjects(objs)
	for i, o := range objs {
		path := filepath.Join(dir, fmt.Sprintf("%06d.sqlite", i))
		if err := fetchObject(ctx, b, o, path); err != nil {
			return nil, fmt.Errorf("read %s: %w", o.Key, err)
		}
		f, err := snapfile.Open(ctx, path, snapfile.Options{Segment: true})
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, o.Key, err)
		}
		err = f.Scan(ctx, snapfile.ScanOptions{IncludeDeleted: true, Before: st.Commit.Epoch + 1}, func(rows []rowbatch.Row) error {
			_, err := merged.Write(ctx, rows)
			return err
		})
		f.Close()
		os.Remove(path)
		if err != nil {
			return nil, err
		}
	}
	counts := map[string]int64{}
	err = merged.Scan(ctx, snapfile.ScanOptions{}, func(rows []rowbatch.Row) error {
		for _, r := range rows {
			counts[r.StepID]++
		}
		return nil
	})
	return counts, err
}

// Problem is one thing Verify found wrong.
type Problem struct {
	Key     string `json:"key"`
	Problem string `json:"problem"`
}

// Verify checks a flow's durable data: every commit record's checksum and
// flow, the chain of commit epochs against execution records, and every
// object the retained records name (present, size, sha256, and a readable
// snapshot file of this flow). It returns the problems found; none means
// the data is sound.
func Verify(ctx context.Context, b backup.Backup, flow string, k Key) ([]Problem, error) {
	var probs []Problem
	list, err := b.List(ctx, flowPrefix(flow))
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", b, err)
	}
	sizes := map[string]int64{}
	var commitEpochs []int64
	for _, o := range list {
		sizes[o.Key] = o.Size
		if e, ok := recordNumber(o.Key, commitsDir); ok {
			commitEpochs = append(commitEpochs, e)
		}
	}
	sort.Slice(commitEpochs, func(i, j int) bool { return commitEpochs[i] < commitEpochs[j] })
	dir, err := os.MkdirTemp("", "mp-verify-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	checked := map[string]bool{}
	for _, e := range commitEpochs {
		key := commitKey(flow, e)
		rec, err := readCommit(ctx, b, flow, e, k)
		if err != nil {
			probs = append(probs, Problem{Key: key, Problem: err.Error()})
			continue
		}
		if rec.Epoch != e {
			probs = append(probs, Problem{Key: key, Problem: fmt.Sprintf("record says epoch %d", rec.Epoch)})
		}
		for _, o := range rec.Objects {
			if checked[o.Key] {
				continue
			}
			checked[o.Key] = true
			if o.LastEpoch > rec.Epoch {
				probs = append(probs, Problem{Key: o.Key, Problem: fmt.Sprintf("named by the commit of epoch %d but holds epoch %d", rec.Epoch, o.LastEpoch)})
			}
			size, ok := sizes[o.Key]
			if !ok {
				probs = append(probs, Problem{Key: o.Key, Problem: fmt.Sprintf("missing (named by the commit of epoch %d)", rec.Epoch)})
				continue
			}
			// A listing that reports no size (-1: a backup written in
			// Python) leaves the check to the download's checksum below.
			if size >= 0 && size != o.Size {
				probs = append(probs, Problem{Key: o.Key, Problem: fmt.Sprintf("size %d, the commit record says %d (truncated or replaced)", size, o.Size)})
				continue
			}
			if p := verifyObject(ctx, b, flow, o, filepath.Join(dir, "obj")); p != "" {
				probs = append(probs, Problem{Key: o.Key, Problem: p})
			}
		}
	}
	if _, err := ReadState(ctx, b, flow, k); err != nil && len(probs) == 0 {
		probs = append(probs, Problem{Key: flowPrefix(flow), Problem: err.Error()})
	}
	return probs, nil
}

func verifyObject(ctx context.Context, b backup.Backup, flow string, o ObjectRef, path string) string {
	defer os.Remove(path)
	if err := checkEncoding(o); err != nil {
		return err.Error()
	}
	stored := path
	if o.Encoding != "" {
		stored = path + ".zst"
		defer os.Remove(stored)
	}
	if err := b.Download(ctx, o.Key, stored); err != nil {
		return fmt.Sprintf("cannot download: %v", err)
	}
	sum, _, err := fileSHA256(stored)
	if err != nil {
		return err.Error()
	}
	if sum != o.SHA256 {
		return fmt.Sprintf("checksum mismatch: sha256 %s, the commit record says %s", sum, o.SHA256)
	}
	if o.Encoding != "" {
		if err := decodeFile(stored, path, o.Key); err != nil {
			return fmt.Sprintf("unreadable: %v", err)
		}
	}
	f, err := snapfile.Open(ctx, path, snapfile.Options{Segment: true})
	if err != nil {
		return fmt.Sprintf("unreadable: %v", err)
	}
	defer f.Close()
	m := f.Meta()
	if m.FlowID != flow {
		return fmt.Sprintf("belongs to flow %q", m.FlowID)
	}
	st, err := f.Stats(ctx)
	if err != nil {
		return fmt.Sprintf("unreadable: %v", err)
	}
	if st.Rows != o.Rows {
		return fmt.Sprintf("holds %d rows, the commit record says %d", st.Rows, o.Rows)
	}
	return ""
}
