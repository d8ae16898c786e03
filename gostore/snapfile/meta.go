package snapfile

import (
	"errors"
	"fmt"
	"strconv"
)

// FormatVersion names the schema of a snapshot file: version 2 gives every
// row a CRC-32C (column crc) and the metadata a checksum (meta_crc). A
// file with another value than this or LegacyFormatVersion is refused
// rather than guessed at.
const FormatVersion = "millpond-snapshot-2"

// LegacyFormatVersion is the schema written by older versions: the same
// rows without checksums. Such files are still read (a segment's integrity
// is covered by the checksum of the whole object in its commit record) but
// never written to; see File.RowChecksums.
const LegacyFormatVersion = "millpond-snapshot-1"

// Kind tells what a snapshot file is used for. The schema is the same.
type Kind string

// The kinds of snapshot file.
const (
	// KindLocal is a worker's retained local store.
	KindLocal Kind = "local"
	// KindSegment is an immutable segment bound for the durable store.
	KindSegment Kind = "segment"
	// KindCompacted is a segment produced by merging older segments.
	KindCompacted Kind = "compacted"
)

// Meta is what a snapshot file records about itself, so a reader can refuse
// a file that belongs to another flow or layout instead of mixing it in.
type Meta struct {
	FlowID        string
	Kind          Kind
	WorkerIndex   int
	WorkerCount   int
	KeyGroupCount int
	// Execution is the execution that wrote the file (segments) or last
	// opened it (local stores).
	Execution int64
	// FirstEpoch and LastEpoch bound the epochs of the rows in a segment;
	// zero when unknown or for a local store.
	FirstEpoch int64
	LastEpoch  int64
	// GCEpoch is the committed epoch up to which superseded rows have been
	// removed (local stores).
	GCEpoch int64
	// CommittedEpoch is the newest epoch the local store saw committed
	// (local stores; 0 in files of LegacyFormatVersion), so a later run
	// can tell what this store saw even if the durable store changed.
	CommittedEpoch int64
}

func (m Meta) fields() map[string]string {
	return map[string]string{
		"format":          FormatVersion,
		"flow_id":         m.FlowID,
		"kind":            string(m.Kind),
		"worker_index":    strconv.Itoa(m.WorkerIndex),
		"worker_count":    strconv.Itoa(m.WorkerCount),
		"key_group_count": strconv.Itoa(m.KeyGroupCount),
		"execution":       strconv.FormatInt(m.Execution, 10),
		"first_epoch":     strconv.FormatInt(m.FirstEpoch, 10),
		"last_epoch":      strconv.FormatInt(m.LastEpoch, 10),
		"gc_epoch":        strconv.FormatInt(m.GCEpoch, 10),
		"committed_epoch": strconv.FormatInt(m.CommittedEpoch, 10),
	}
}

// fieldsWithCRC is fields plus the checksum over them: what is stored.
func (m Meta) fieldsWithCRC() map[string]string {
	f := m.fields()
	f[metaCRCField] = metaCRC(f)
	return f
}

// metaFromFields parses stored metadata. legacy reports a file of
// LegacyFormatVersion. A file of FormatVersion whose checksum does not
// match its fields is reported with errBadMetaCRC (the caller names the
// file).
func metaFromFields(f map[string]string) (m Meta, legacy bool, err error) {
	if sum, ok := f[metaCRCField]; ok || f["format"] == FormatVersion {
		// Checked before anything is parsed: a flipped bit in the format
		// name is damage, not an unknown format.
		if want := metaCRC(f); sum != want {
			return Meta{}, false, fmt.Errorf("%w: stored %q, computed %s", errBadMetaCRC, sum, want)
		}
	}
	switch got := f["format"]; got {
	case FormatVersion:
	case LegacyFormatVersion:
		legacy = true
		if _, ok := f["committed_epoch"]; !ok {
			f["committed_epoch"] = "0"
		}
	default:
		return Meta{}, false, fmt.Errorf("unknown format %q (want %q)", got, FormatVersion)
	}
	m, err = parseFields(f)
	return m, legacy, err
}

// errBadMetaCRC is wrapped when stored metadata does not match its checksum.
var errBadMetaCRC = errors.New("metadata checksum mismatch")

func parseFields(f map[string]string) (Meta, error) {
	var m Meta
	m.FlowID = f["flow_id"]
	m.Kind = Kind(f["kind"])
	ints := []struct {
		name string
		dst  *int
	}{{"worker_index", &m.WorkerIndex}, {"worker_count", &m.WorkerCount}, {"key_group_count", &m.KeyGroupCount}}
	for _, x := range ints {
		v, err := strconv.Atoi(f[x.name])
		if err != nil {
			return Meta{}, fmt.Errorf("metadata %s: %w", x.name, err)
		}
		*x.dst = v
	}
	int64s := []struct {
		name string
		dst  *int64
	}{{"execution", &m.Execution}, {"first_epoch", &m.FirstEpoch}, {"last_epoch", &m.LastEpoch}, {"gc_epoch", &m.GCEpoch}, {"committed_epoch", &m.CommittedEpoch}}
	for _, x := range int64s {
		v, err := strconv.ParseInt(f[x.name], 10, 64)
		if err != nil {
			return Meta{}, fmt.Errorf("metadata %s: %w", x.name, err)
		}
		*x.dst = v
	}
	if m.FlowID == "" || m.KeyGroupCount < 1 || m.WorkerCount < 1 || m.WorkerIndex < 0 || m.WorkerIndex >= m.WorkerCount {
		return Meta{}, fmt.Errorf("inconsistent metadata %+v", m)
	}
	return m, nil
}
