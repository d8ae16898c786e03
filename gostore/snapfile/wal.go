package snapfile

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Checking the write-ahead log a killed process left. When SQLite first
// opens a file after a crash it replays the log's frames up to the first
// one whose checksum fails, and drops that frame and every later one. For
// a torn write at the end of the log that is right. For a frame damaged in
// the middle it is not: a checkpoint may already have copied the dropped
// frames' pages into the database file, while older versions of other
// pages stay in the log's valid part, so the file SQLite then shows mixes
// two transactions. Rows of such a file pass their checksums (each one is
// a row that was written), yet a key can read an older state or none, and
// the b-tree can be out of order. So before a file is opened for writing,
// checkWAL looks for committed frames SQLite would drop.

const (
	walHeaderSize      = 32
	walFrameHeaderSize = 24
	walMagicLE         = 0x377f0682 // checksums over little-endian words
	walMagicBE         = 0x377f0683 // checksums over big-endian words
	walFormat          = 3007000
	walIndexHeaderSize = 48
)

// walSum is the running checksum of a write-ahead log: two 32-bit sums
// over pairs of words, carried from the header through every frame.
type walSum struct {
	s0, s1 uint32
	little bool // the words are little-endian (else big-endian)
}

// add folds b (a multiple of 8 bytes long) into the sum. The two byte
// orders get a loop each: through the binary.ByteOrder interface the loop
// ran at a third of the speed.
func (c *walSum) add(b []byte) {
	s0, s1 := c.s0, c.s1
	if c.little {
		for ; len(b) >= 8; b = b[8:] {
			s0 += binary.LittleEndian.Uint32(b) + s1
			s1 += binary.LittleEndian.Uint32(b[4:]) + s0
		}
	} else {
		for ; len(b) >= 8; b = b[8:] {
			s0 += binary.BigEndian.Uint32(b) + s1
			s1 += binary.BigEndian.Uint32(b[4:]) + s0
		}
	}
	c.s0, c.s1 = s0, s1
}

// matches reports whether the sum equals the big-endian pair stored in b.
func (c *walSum) matches(b []byte) bool {
	return c.s0 == binary.BigEndian.Uint32(b) && c.s1 == binary.BigEndian.Uint32(b[4:])
}

// checkWAL refuses (with an error wrapping ErrDamaged) the write-ahead log
// of the database at path when SQLite would drop frames of committed
// transactions from it, which a checkpoint may have copied already.
//
// Its first witness is the log's index (-shm), when its header checks out
// (its own checksum, and the salts of the log's current round): it counts
// the frames of committed transactions, as the process that wrote them
// last saw them. Fewer frames that SQLite would replay is damage, wherever
// it is, the last frame included. The index is read before the log, so a
// writer appending meanwhile only adds frames past what it counted.
//
// The first connection to a file after a crash rebuilds the index from the
// log as SQLite replays it (and a copy of the state directory may have
// left it out), so a check that comes later has a second rule, for a file
// with no writer (live false: the opens that write come first after a
// kill): a frame that fails its check (other salts, or a bad checksum)
// followed by a frame of the current round means that frames were lost;
// so does a damaged header with frames after it. A kill leaves at most the
// last frame bad, a write it cut short, and frames of an earlier round of
// the log after the valid ones are what SQLite leaves when it starts the
// log over: both are fine. A damaged last frame is seen only through the
// index. With live true (a file a writer may be appending to, or
// checkpointing, or restarting the log of), only the index rule applies,
// and a log that changed under the read (it shrank, or the index moved on
// since) is no finding.
//
// It must run before any connection opens the file: the first one replays
// the log, and its checkpoint would fold the mixed pages in for good.
func checkWAL(path string, live bool) error {
	walPath := path + "-wal"
	committed, indexSalts, indexed := walIndexFrames(path + "-shm")
	fh, err := os.Open(walPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check write-ahead log %s: %w", walPath, err)
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return fmt.Errorf("check write-ahead log %s: %w", walPath, err)
	}
	size := st.Size()
	if size < walHeaderSize {
		return nil
	}
	r := bufio.NewReaderSize(fh, 1<<20)
	hdr := make([]byte, walHeaderSize)
	if _, err := io.ReadFull(r, hdr); err != nil {
		if live {
			return nil // a checkpoint truncated the log under the read
		}
		return fmt.Errorf("check write-ahead log %s: %w", walPath, err)
	}
	sum, pageSize, ok := walHeader(hdr)
	if !ok {
		// Without a valid header SQLite ignores the whole log. The
		// smallest frame is 24 bytes of header and a 512-byte page.
		if !live && size >= walHeaderSize+walFrameHeaderSize+512 {
			return damagedf(path, "the header of its write-ahead log (%s) is damaged, so SQLite would drop all %d bytes of frames after it", filepath.Base(walPath), size-walHeaderSize)
		}
		return nil
	}
	salts := hdr[16:24]
	indexed = indexed && string(indexSalts) == string(salts)
	if live && !indexed {
		return nil
	}
	frameSize := int64(walFrameHeaderSize + pageSize)
	frames := (size - walHeaderSize) / frameSize
	frame := make([]byte, frameSize)
	bad := int64(-1)   // the first frame SQLite would not replay
	var replayed int64 // frames through the last commit frame before bad
	for i := int64(0); i < frames; i++ {
		if indexed && live && i >= committed {
			break // frames a writer may be writing right now
		}
		if _, err := io.ReadFull(r, frame); err != nil {
			if live {
				return nil // a checkpoint truncated the log under the read
			}
			return fmt.Errorf("check write-ahead log %s: frame %d: %w", walPath, i, err)
		}
		current := string(frame[8:16]) == string(salts)
		if bad >= 0 {
			if current && !live {
				return damagedf(path, "frame %d of its write-ahead log (%s, byte %d) is damaged, so SQLite would drop it and the frames after it (frame %d is one of the current log), whose pages a checkpoint may already have copied into the file",
					bad, filepath.Base(walPath), walHeaderSize+bad*frameSize, i)
			}
			continue
		}
		if current && binary.BigEndian.Uint32(frame) != 0 {
			sum.add(frame[:8])
			sum.add(frame[walFrameHeaderSize:])
			if sum.matches(frame[16:24]) {
				if binary.BigEndian.Uint32(frame[4:]) != 0 { // a commit frame
					replayed = i + 1
				}
				continue
			}
		}
		bad = i
	}
	if indexed && committed > replayed {
		if live {
			// Beside a writer the log may have been started over (or
			// truncated) while it was read: only an index that still
			// says the same makes what was read a finding.
			again, againSalts, ok := walIndexFrames(path + "-shm")
			if !ok || again != committed || string(againSalts) != string(indexSalts) {
				return nil
			}
		}
		return damagedf(path, "the index of its write-ahead log (%s-shm) says %d frames were committed, but SQLite would replay only %d (frame %d of %s is damaged)",
			filepath.Base(path), committed, replayed, max(bad, 0), filepath.Base(walPath))
	}
	return nil
}

// walIndexFrames reads the count of committed frames (mxFrame) and the
// salts of the log's round from the write-ahead log's index (-shm): SQLite
// raises the count once a transaction's frames are all written. It
// reports false when there is no index or its header does not check out.
func walIndexFrames(shmPath string) (int64, []byte, bool) {
	fh, err := os.Open(shmPath)
	if err != nil {
		return 0, nil, false
	}
	defer fh.Close()
	// Two copies of the 48-byte header, which must agree; the fields are
	// in the machine's byte order, the salts as the log's header has them.
	var hdr [2 * walIndexHeaderSize]byte
	if _, err := io.ReadFull(fh, hdr[:]); err != nil {
		return 0, nil, false
	}
	h := hdr[:walIndexHeaderSize]
	if string(h) != string(hdr[walIndexHeaderSize:]) || binary.NativeEndian.Uint32(h) != walFormat || h[12] != 1 {
		return 0, nil, false
	}
	sum := walSum{little: binary.NativeEndian.Uint16([]byte{1, 0}) == 1}
	sum.add(h[:40])
	if sum.s0 != binary.NativeEndian.Uint32(h[40:]) || sum.s1 != binary.NativeEndian.Uint32(h[44:]) {
		return 0, nil, false
	}
	return int64(binary.NativeEndian.Uint32(h[16:])), append([]byte(nil), h[32:40]...), true
}

// walHeader checks a write-ahead log's header and returns the checksum it
// starts the frames with and the page size.
func walHeader(hdr []byte) (walSum, int, bool) {
	var sum walSum
	switch binary.BigEndian.Uint32(hdr) {
	case walMagicLE:
		sum.little = true
	case walMagicBE:
	default:
		return sum, 0, false
	}
	if binary.BigEndian.Uint32(hdr[4:]) != walFormat {
		return sum, 0, false
	}
	pageSize := int(binary.BigEndian.Uint32(hdr[8:]))
	if pageSize == 1 {
		pageSize = 65536
	}
	if pageSize < 512 || pageSize > 65536 || pageSize&(pageSize-1) != 0 {
		return sum, 0, false
	}
	sum.add(hdr[:24])
	if !sum.matches(hdr[24:32]) {
		return sum, 0, false
	}
	return sum, pageSize, true
}
