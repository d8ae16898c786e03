package durable

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/millpond/millpond/gostore/localstore"
)

// A backup that lost committed state. The backup alone says where a flow
// resumes; if it was emptied (or its newest commit records deleted) while
// the flow was stopped, it says "nothing committed" or an older epoch, and
// a run would start over, throwing away the local stores that still hold
// the committed state, without a word. Every local store records the
// newest epoch it saw committed, so a run first compares: a local store
// that saw an epoch committed which the backup does not have stops the
// run. Starting over on purpose is then explicit: remove the flow's local
// state directory.

// ErrBackupLost is wrapped when a local store saw epochs committed that the
// backup no longer has.
var ErrBackupLost = errors.New("the backup lost committed state")

// checkLocalCommits compares the committed epochs the flow's local stores
// saw with the backup's newest commit. Stores that cannot be read are
// skipped: a damaged store is rebuilt anyway, and it cannot vouch for what
// was committed.
func checkLocalCommits(ctx context.Context, cfg Config, st State) error {
	flowDir := filepath.Join(cfg.LocalDir, cfg.FlowID)
	entries, err := os.ReadDir(flowDir)
	if err != nil {
		return nil // no local state: nothing to compare
	}
	var seen int64
	for _, e := range entries {
		num, ok := strings.CutPrefix(e.Name(), "worker-")
		if !ok || !e.IsDir() {
			continue
		}
		w, err := strconv.Atoi(num)
		if err != nil {
			continue
		}
		meta, err := localstore.InspectOther(ctx, cfg.LocalDir, cfg.FlowID, w)
		if err != nil || meta.FlowID != cfg.FlowID {
			continue
		}
		seen = max(seen, meta.CommittedEpoch)
	}
	if seen <= st.Commit.Epoch {
		return nil
	}
	// A run of the flow may be committing right now (a racing start, which
	// the stores' locks and the execution fence refuse later): its commit
	// can land between the read of the backup and that of the local
	// stores. The backup is read again before it is called lost.
	if again, err := ReadState(ctx, cfg.Backup, cfg.FlowID, cfg.Key); err == nil && again.Commit.Epoch >= seen {
		return nil
	}
	has := "no commit at all"
	if st.Commit.Epoch > 0 {
		has = fmt.Sprintf("epoch %d as its newest commit", st.Commit.Epoch)
	}
	return fmt.Errorf("%w: the local state directory %s says flow %q committed epoch %d, but backup %s has %s (it was emptied, replaced, or its newest commit records were deleted). Nothing was changed. Restore the backup from a copy and run again; or, to start over from what the backup holds on purpose, remove %s and run again",
		ErrBackupLost, flowDir, cfg.FlowID, seen, cfg.Backup, has, flowDir)
}
