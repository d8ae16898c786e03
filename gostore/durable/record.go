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
	// Size and SHA256 describe the object as stored (compressed when
	// Encoding says so): they are checked before it is decoded.
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// Encoding is how the stored bytes encode the object's SQLite file:
	// EncodingZstd, or empty for the file as is (objects written before
	// compression). The record's seal covers it like every field.
	Encoding string `json:"encoding,omitempty"`
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
	CommittedUnix int64 `json:"committed_unix,omitempty"`
	// Auth is AuthHMAC when Checksum is a keyed MAC (seal.go), empty when
	// it is a plain SHA-256.
	Auth     string `json:"auth,omitempty"`
	Checksum string `json:"checksum"`
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
	// Nonce is random: two runs that race for one execution number write
	// records that differ, so a run that finds the record there can tell
	// its own (a retried create whose first answer was lost) from the
	// winner's.
	Nonce    string `json:"nonce,omitempty"`
	Auth     string `json:"auth,omitempty"`
	Checksum string `json:"checksum"`
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

// record is what decodeRecord needs of a commit or execution record.
type record interface {
	header() (format, flow string, seal *seal)
}

func (r *CommitRecord) header() (string, string, *seal) {
	return r.Format, r.FlowID, &seal{auth: &r.Auth, sum: &r.Checksum}
}

func (r *ExecutionRecord) header() (string, string, *seal) {
	return r.Format, r.FlowID, &seal{auth: &r.Auth, sum: &r.Checksum}
}

// decodeRecord parses a JSON record and checks its format, seal and flow,
// naming key in every error. The seal is checked before any field is
// trusted: with a key, a record it does not authenticate is refused
// whatever it says.
func decodeRecord[T any, P interface {
	*T
	record
}](data []byte, key, flow, wantFormat string, k Key) (T, error) {
	var r T
	p := P(&r)
	if err := json.Unmarshal(data, p); err != nil {
		return r, fmt.Errorf("%w: %s: %v; %s", ErrCorrupt, key, err, dropRecordHint)
	}
	format, owner, sl := p.header()
	if format != wantFormat {
		return r, fmt.Errorf("%w: %s: unknown format %q; %s", ErrCorrupt, key, format, dropRecordHint)
	}
	if err := k.check(p, sl, key); err != nil {
		return r, err
	}
	if owner != flow {
		return r, fmt.Errorf("%w: %s belongs to flow %q, not %q", ErrCorrupt, key, owner, flow)
	}
	return r, nil
}

// dropRecordHint says what to do about a damaged record.
const dropRecordHint = "restore it from a copy of the backup, or delete it (and the local state directory of the flow) to resume from the commit before it"

func decodeCommit(data []byte, key, flow string, k Key) (CommitRecord, error) {
	return decodeRecord[CommitRecord](data, key, flow, commitFormat, k)
}

func decodeExecution(data []byte, key, flow string, k Key) (ExecutionRecord, error) {
	return decodeRecord[ExecutionRecord](data, key, flow, executionFormat, k)
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
