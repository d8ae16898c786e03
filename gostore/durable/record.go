package durable

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
)

// ErrCorrupt is wrapped when a durable object fails its checksum, is
// truncated, or does not belong to the flow it is read for.
var ErrCorrupt = errors.New("corrupt durable object")

// Format names of the JSON records.
const (
	commitFormat    = "millpond-commit-1"
	executionFormat = "millpond-execution-1"
)

// Object kinds in a commit record.
const (
	KindSegment   = "segment"
	KindCompacted = "compacted"
)

// ObjectRef describes one object that makes up committed state.
type ObjectRef struct {
	Key         string `json:"key"`
	Kind        string `json:"kind"`
	Execution   int64  `json:"execution"`
	Worker      int    `json:"worker"`
	WorkerCount int    `json:"worker_count"`
	GroupLo     int    `json:"group_lo"`
	GroupHi     int    `json:"group_hi"`
	FirstEpoch  int64  `json:"first_epoch"`
	LastEpoch   int64  `json:"last_epoch"`
	Seq         int64  `json:"seq"`
	Rows        int64  `json:"rows"`
	Size        int64  `json:"size"`
	SHA256      string `json:"sha256"`
}

// CommitRecord names the state of a flow at a committed epoch.
type CommitRecord struct {
	Format        string      `json:"format"`
	FlowID        string      `json:"flow_id"`
	Epoch         int64       `json:"epoch"`
	Execution     int64       `json:"execution"`
	WorkerCount   int         `json:"worker_count"`
	KeyGroupCount int         `json:"key_group_count"`
	Objects       []ObjectRef `json:"objects"`
	// CommittedUnix is when the record was written (seconds since the
	// epoch), for retention by time; absent in records of older versions.
	CommittedUnix int64  `json:"committed_unix,omitempty"`
	Checksum      string `json:"checksum"`
}

// ExecutionRecord marks the start of a run.
type ExecutionRecord struct {
	Format        string `json:"format"`
	FlowID        string `json:"flow_id"`
	Execution     int64  `json:"execution"`
	ResumeEpoch   int64  `json:"resume_epoch"`
	WorkerCount   int    `json:"worker_count"`
	KeyGroupCount int    `json:"key_group_count"`
	StartedUnix   int64  `json:"started_unix"`
	Checksum      string `json:"checksum"`
}

// sortObjects puts objects in the order a restore applies them: compacted
// state first, then segments by epoch and emission order.
func sortObjects(objs []ObjectRef) {
	sort.SliceStable(objs, func(i, j int) bool {
		a, b := objs[i], objs[j]
		if (a.Kind == KindCompacted) != (b.Kind == KindCompacted) {
			return a.Kind == KindCompacted
		}
		if a.LastEpoch != b.LastEpoch {
			return a.LastEpoch < b.LastEpoch
		}
		if a.Execution != b.Execution {
			return a.Execution < b.Execution
		}
		if a.Worker != b.Worker {
			return a.Worker < b.Worker
		}
		return a.Seq < b.Seq
	})
}

// sealJSON sets the record's checksum: sha256 of its JSON with the checksum
// field empty.
func sealJSON(v any, checksum *string) ([]byte, error) {
	*checksum = ""
	body, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	*checksum = hex.EncodeToString(sum[:])
	return json.MarshalIndent(v, "", " ")
}

func verifyJSON(v any, checksum *string, key string) error {
	want := *checksum
	*checksum = ""
	body, err := json.Marshal(v)
	*checksum = want
	if err != nil {
		return err
	}
	sum := sha256.Sum256(body)
	if hex.EncodeToString(sum[:]) != want {
		return fmt.Errorf("%w: %s: checksum mismatch", ErrCorrupt, key)
	}
	return nil
}

// record is what decodeRecord needs of a commit or execution record.
type record interface {
	header() (format, flow string, checksum *string)
}

func (r *CommitRecord) header() (string, string, *string)    { return r.Format, r.FlowID, &r.Checksum }
func (r *ExecutionRecord) header() (string, string, *string) { return r.Format, r.FlowID, &r.Checksum }

// decodeRecord parses a JSON record and checks its format, checksum and
// flow, naming key in every error.
func decodeRecord[T any, P interface {
	*T
	record
}](data []byte, key, flow, wantFormat string) (T, error) {
	var r T
	p := P(&r)
	if err := json.Unmarshal(data, p); err != nil {
		return r, fmt.Errorf("%w: %s: %v", ErrCorrupt, key, err)
	}
	format, owner, checksum := p.header()
	if format != wantFormat {
		return r, fmt.Errorf("%w: %s: unknown format %q", ErrCorrupt, key, format)
	}
	if err := verifyJSON(p, checksum, key); err != nil {
		return r, err
	}
	if owner != flow {
		return r, fmt.Errorf("%w: %s belongs to flow %q, not %q", ErrCorrupt, key, owner, flow)
	}
	return r, nil
}

func decodeCommit(data []byte, key, flow string) (CommitRecord, error) {
	return decodeRecord[CommitRecord](data, key, flow, commitFormat)
}

func decodeExecution(data []byte, key, flow string) (ExecutionRecord, error) {
	return decodeRecord[ExecutionRecord](data, key, flow, executionFormat)
}

// fileSHA256 returns the hex sha256 and size of a file.
func fileSHA256(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}
