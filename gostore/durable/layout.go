// The layout of a flow's objects in the backup (see doc.go).

package durable

import (
	"fmt"
	"strconv"
	"strings"
)

// Key prefixes inside a flow's namespace.
const (
	executionsDir = "executions/"
	segmentsDir   = "segments/"
	compactedDir  = "compacted/"
	commitsDir    = "commits/"
)

func flowPrefix(flow string) string { return flow + "/" }

func executionKey(flow string, exec int64) string {
	return fmt.Sprintf("%s%s%06d.json", flowPrefix(flow), executionsDir, exec)
}

func commitKey(flow string, epoch int64) string {
	return fmt.Sprintf("%s%s%010d.json", flowPrefix(flow), commitsDir, epoch)
}

func segmentKey(flow string, exec int64, worker int, epoch, seq int64) string {
	return fmt.Sprintf("%s%s%06d/w%04d-e%010d-s%06d.sqlite", flowPrefix(flow), segmentsDir, exec, worker, epoch, seq)
}

// compactedKey names a compacted object; variant > 0 tells apart the
// objects of a compaction that rebuilt lost ones (heal.go).
func compactedKey(flow string, epoch, exec int64, worker, count, variant int) string {
	if variant > 0 {
		return fmt.Sprintf("%s%s%010d-x%06d-w%04dof%04d-h%d.sqlite", flowPrefix(flow), compactedDir, epoch, exec, worker, count, variant)
	}
	return fmt.Sprintf("%s%s%010d-x%06d-w%04dof%04d.sqlite", flowPrefix(flow), compactedDir, epoch, exec, worker, count)
}

// numberAfter parses the decimal number that starts a key's base name
// under dir ("<flow>/commits/0000000012.json" -> 12).
func numberAfter(key, dir string) (int64, bool) {
	i := strings.Index(key, "/"+dir)
	if i < 0 {
		return 0, false
	}
	base := key[i+1+len(dir):]
	end := strings.IndexAny(base, ".-")
	if end <= 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(base[:end], 10, 64)
	return n, err == nil
}

// recordNumber parses the number of a commit or execution record
// ("<flow>/commits/0000000012.json" -> 12). Anything else under dir (a
// backend's temp file left by a crash, "0000000012.json.tmp") is not a
// record: taking it for one would read a record that does not exist.
func recordNumber(key, dir string) (int64, bool) {
	i := strings.Index(key, "/"+dir)
	if i < 0 {
		return 0, false
	}
	digits, ok := strings.CutSuffix(key[i+1+len(dir):], ".json")
	if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	return n, err == nil
}
