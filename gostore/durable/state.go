package durable

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/millpond/millpond/gostore/backup"
	"golang.org/x/sys/unix"
)

// ErrBackup is matched (errors.Is) by errors of the backup itself
// (unreachable, denied, an I/O error), as opposed to bad data in it. It
// adds no words to their messages, which say what failed already.
var ErrBackup = errors.New("backup failed")

// backupFailed marks err as a failure of the backup itself (ErrBackup).
func backupFailed(err error) error { return backupError{err} }

type backupError struct{ err error }

func (e backupError) Error() string        { return e.err.Error() }
func (e backupError) Unwrap() error        { return e.err }
func (e backupError) Is(target error) bool { return target == ErrBackup }

// State is what the durable store alone says about a flow: where a new
// execution resumes and which objects hold the state there.
type State struct {
	FlowID string
	// Commit is the newest commit record; zero Epoch when nothing committed.
	Commit CommitRecord
	// CommitKeys lists the commit records present, oldest first.
	CommitEpochs []int64
	// LastExecution is the newest execution recorded, -1 when none.
	LastExecution int64
}

// ResumeEpoch is the first epoch a new execution processes.
func (s State) ResumeEpoch() int64 { return s.Commit.Epoch + 1 }

// NextExecution is the number of the next execution.
func (s State) NextExecution() int64 { return s.LastExecution + 1 }

// ReadState reads the commit records and execution records of flow. The
// newest commit record must be intact (and, with a key, authenticated by
// it): a damaged one is an error naming it, never a silent fall-back that
// would lose committed state.
func ReadState(ctx context.Context, b backup.Backup, flow string, k Key) (State, error) {
	st := State{FlowID: flow, LastExecution: -1}
	commits, err := b.List(ctx, flowPrefix(flow)+commitsDir)
	if err != nil {
		return st, backupFailed(fmt.Errorf("list commit records of flow %q in %s: %w", flow, b, err))
	}
	for _, o := range commits {
		if e, ok := recordNumber(o.Key, commitsDir); ok {
			st.CommitEpochs = append(st.CommitEpochs, e)
		}
	}
	sort.Slice(st.CommitEpochs, func(i, j int) bool { return st.CommitEpochs[i] < st.CommitEpochs[j] })
	if n := len(st.CommitEpochs); n > 0 {
		rec, err := readCommit(ctx, b, flow, st.CommitEpochs[n-1], k)
		if err != nil {
			if errors.Is(err, ErrCorrupt) {
				err = fmt.Errorf("%w (the commit before it is epoch %s)", err, previous(st.CommitEpochs))
			}
			return st, err
		}
		st.Commit = rec
	}
	execs, err := b.List(ctx, flowPrefix(flow)+executionsDir)
	if err != nil {
		return st, backupFailed(fmt.Errorf("list execution records of flow %q in %s: %w", flow, b, err))
	}
	for _, o := range execs {
		if x, ok := recordNumber(o.Key, executionsDir); ok && x > st.LastExecution {
			st.LastExecution = x
		}
	}
	if st.Commit.Epoch > 0 && st.Commit.Execution > st.LastExecution {
		st.LastExecution = st.Commit.Execution
	}
	return st, nil
}

func previous(epochs []int64) string {
	if len(epochs) < 2 {
		return "none: a fresh start"
	}
	return fmt.Sprint(epochs[len(epochs)-2])
}

func readCommit(ctx context.Context, b backup.Backup, flow string, epoch int64, k Key) (CommitRecord, error) {
	key := commitKey(flow, epoch)
	data, err := downloadBytes(ctx, b, key)
	if err != nil {
		return CommitRecord{}, err
	}
	return decodeCommit(data, key, flow, k)
}

// downloadBytes fetches a small object into memory: directly from a
// backend that can (backup.Small), through a temporary file otherwise (a
// backup written in Python).
func downloadBytes(ctx context.Context, b backup.Backup, key string) ([]byte, error) {
	if sb, ok := b.(backup.Small); ok {
		data, err := sb.Get(ctx, key)
		if err != nil {
			return nil, backupFailed(err) // it names the key and the store
		}
		return data, nil
	}
	// First into a file without a name, which a killed process cannot
	// leave behind; a backend that writes its download elsewhere and
	// renames it into place cannot do that, and gets a directory.
	if f, path, err := unlinkedFile(nil); err == nil {
		defer f.Close()
		err := b.Download(ctx, key, path)
		if err == nil {
			return io.ReadAll(f)
		}
		if errors.Is(err, backup.ErrNotFound) {
			return nil, backupFailed(fmt.Errorf("download %s from %s: %w", key, b, err))
		}
	}
	dir, err := recordTempDir()
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "obj")
	if err := b.Download(ctx, key, path); err != nil {
		return nil, backupFailed(fmt.Errorf("download %s from %s: %w", key, b, err))
	}
	return os.ReadFile(path)
}

// recordTempPrefix starts the temporary directories of small downloads
// from a backend without backup.Small; the pid that follows lets a later
// run remove those of a process that was killed.
const recordTempPrefix = "mp-record-"

// recordTempDir makes a private temporary directory for one small
// download, after removing those that killed processes left behind.
func recordTempDir() (string, error) {
	tmp := os.TempDir()
	if entries, err := os.ReadDir(tmp); err == nil {
		for _, e := range entries {
			rest, ok := strings.CutPrefix(e.Name(), recordTempPrefix)
			pid, _, _ := strings.Cut(rest, "-")
			if n, err := strconv.Atoi(pid); ok && err == nil && n != os.Getpid() && !processAlive(n) {
				os.RemoveAll(filepath.Join(tmp, e.Name()))
			}
		}
	}
	return os.MkdirTemp(tmp, fmt.Sprintf("%s%d-", recordTempPrefix, os.Getpid()))
}

// processAlive reports whether a process with pid exists.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// unlinkedFile holds data in a temporary file whose name is gone already,
// so a process killed while it is in use leaves nothing behind; path
// opens it (through /proc/self/fd) for as long as the file stays open.
func unlinkedFile(data []byte) (f *os.File, path string, err error) {
	f, err = nameless()
	if err != nil {
		return nil, "", err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, "", err
	}
	path = fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	if _, err := os.Stat(path); err != nil {
		f.Close()
		return nil, "", fmt.Errorf("no /proc/self/fd to hand a record to the backup: %w", err)
	}
	return f, path, nil
}

// nameless opens a temporary file that never has a name (O_TMPFILE), so
// no kill can leave it behind. Where the file system cannot do that, the
// file gets a name with the pid (which recordTempDir's sweep removes once
// the process is gone) and loses it at once.
func nameless() (*os.File, error) {
	dir := os.TempDir()
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err == nil {
		return os.NewFile(uintptr(fd), filepath.Join(dir, recordTempPrefix+"nameless")), nil
	}
	f, err := os.CreateTemp(dir, fmt.Sprintf("%s%d-file-", recordTempPrefix, os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("temporary file in %s: %w", dir, err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("unlink temporary file %s: %w", f.Name(), err)
	}
	return f, nil
}

// uploadBytes stores a small object; with create set, only if no object
// has its key (backup.ErrExists otherwise).
func uploadBytes(ctx context.Context, b backup.Backup, key string, data []byte, create bool) error {
	if sb, ok := b.(backup.Small); ok {
		put := sb.Put
		if create {
			put = sb.Create
		}
		if err := put(ctx, key, data); err != nil {
			if errors.Is(err, backup.ErrExists) {
				return err
			}
			return backupFailed(err) // it names the key and the store
		}
		return nil
	}
	if create {
		// A backend that cannot create conditionally (a backup written
		// in Python) gets a check first: it narrows the race to two
		// requests but cannot close it (docs/recovery.md says so).
		objs, err := b.List(ctx, key)
		if err != nil {
			return backupFailed(fmt.Errorf("list %s in %s: %w", key, b, err))
		}
		for _, o := range objs {
			if o.Key == key {
				return fmt.Errorf("%s: %w", key, backup.ErrExists)
			}
		}
	}
	f, path, err := unlinkedFile(data)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := b.Upload(ctx, path, key); err != nil {
		return backupFailed(fmt.Errorf("upload %s to %s: %w", key, b, err))
	}
	return nil
}

// ErrRaced is wrapped when another run of the flow created the same
// execution record first: two starts raced, and this one lost.
var ErrRaced = errors.New("another run of this flow started at the same time")

// RecordExecution writes the execution record of a new run, before it
// processes anything. The record is created only if it does not exist:
// of two runs that read the same state and both want execution N, one
// wins and the other gets ErrRaced before it wrote anything.
func RecordExecution(ctx context.Context, b backup.Backup, rec ExecutionRecord, k Key) error {
	rec.Format = executionFormat
	rec.Nonce = rand.Text()
	data, err := k.seal(&rec, &seal{auth: &rec.Auth, sum: &rec.Checksum})
	if err != nil {
		return err
	}
	key := executionKey(rec.FlowID, rec.Execution)
	if err := uploadBytes(ctx, b, key, data, true); err != nil {
		if errors.Is(err, backup.ErrExists) && isOwnRecord(ctx, b, key, data) {
			return nil
		}
		if errors.Is(err, backup.ErrExists) {
			return fmt.Errorf("%w: %s on %s was created by another run of flow %q a moment ago (both read the same state); this run stops before it writes anything. Run one instance of a flow at a time",
				ErrRaced, key, b, rec.FlowID)
		}
		return err
	}
	return nil
}

// isOwnRecord reports whether the object at key holds data: a create whose
// answer was lost and that was retried finds its own record there.
func isOwnRecord(ctx context.Context, b backup.Backup, key string, data []byte) bool {
	got, err := downloadBytes(ctx, b, key)
	return err == nil && bytes.Equal(got, data)
}

func writeCommit(ctx context.Context, b backup.Backup, rec CommitRecord, k Key) error {
	rec.Format = commitFormat
	data, err := k.seal(&rec, &seal{auth: &rec.Auth, sum: &rec.Checksum})
	if err != nil {
		return err
	}
	return uploadBytes(ctx, b, commitKey(rec.FlowID, rec.Epoch), data, false)
}

// Flows lists the flow ids that have durable data in b.
func Flows(ctx context.Context, b backup.Backup) ([]string, error) {
	objs, err := b.List(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", b, err)
	}
	seen := map[string]bool{}
	var flows []string
	for _, o := range objs {
		i := strings.Index(o.Key, "/")
		if i <= 0 {
			continue
		}
		f := o.Key[:i]
		if !seen[f] && (strings.HasPrefix(o.Key[i+1:], commitsDir) || strings.HasPrefix(o.Key[i+1:], executionsDir)) {
			seen[f] = true
			flows = append(flows, f)
		}
	}
	sort.Strings(flows)
	return flows, nil
}

var errStopped = errors.New("recovery run is closed")
