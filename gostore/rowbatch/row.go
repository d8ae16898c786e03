// Package rowbatch defines a state row and the packed binary form in which
// batches of rows cross the boundary between Python and the Go core.
//
// Python packs a whole snapshot batch into one buffer (in C, in the
// extension) and hands it over in one call, so the per-row cost of crossing
// the language boundary is a few bytes of copying. The decoder is the first
// thing to touch bytes that came from outside the core: it must reject
// malformed input with an error, never panic.
package rowbatch

// Row is one snapshot row: the serialized state of one key of one step as of
// the end of an epoch, or the record that the key was discarded.
type Row struct {
	StepID  string
	Key     string
	Epoch   int64
	Value   []byte // the serialized state; nil when Deleted
	Deleted bool
}

// Less orders rows by (step id, key, epoch), the snapshot file's primary key
// order; writing in this order keeps B-tree inserts sequential.
func Less(a, b *Row) bool {
	if a.StepID != b.StepID {
		return a.StepID < b.StepID
	}
	if a.Key != b.Key {
		return a.Key < b.Key
	}
	return a.Epoch < b.Epoch
}
