package snapfile

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/millpond/millpond/gostore/rowbatch"
)

// walEpochs writes epochs from..to to f, each one transaction rewriting
// the same keys with values that name the epoch, so that every epoch
// changes the same pages again.
func walEpochs(t *testing.T, f *File, from, to int64) {
	t.Helper()
	require.NoError(t, writeEpochs(f, from, to))
}

// writeEpochs is walEpochs returning the error, for a goroutine other than
// the test's.
func writeEpochs(f *File, from, to int64) error {
	for e := from; e <= to; e++ {
		rows := make([]rowbatch.Row, 0, 200)
		for k := 0; k < 200; k++ {
			rows = append(rows, row("s", fmt.Sprintf("k%03d", k), e, fmt.Sprintf("%d:%s", e, strings.Repeat("v", 150))))
		}
		if _, err := f.Write(context.Background(), rows); err != nil {
			return err
		}
	}
	return nil
}

// crashImage copies f's database file and write-ahead log, as a kill would
// leave them, to a directory of their own, and returns the copy's path.
// The log's index (-shm) is left out, as a copy to another machine or a
// reboot that clears it would: checkWAL must not need it.
func crashImage(t *testing.T, f *File) string {
	return crashImageOf(t, f, "", "-wal")
}

func crashImageOf(t *testing.T, f *File, suffixes ...string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "image.sqlite")
	for _, suffix := range suffixes {
		b, err := os.ReadFile(f.Path() + suffix)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(dst+suffix, b, 0o600))
	}
	return dst
}

// walFrames returns the log's page size, its header's salts and, for each
// whole frame, its byte offset and whether it carries those salts.
func walFrames(t *testing.T, walPath string) (pageSize int, offsets []int64, current []bool) {
	t.Helper()
	b, err := os.ReadFile(walPath)
	require.NoError(t, err)
	_, pageSize, ok := walHeader(b[:walHeaderSize])
	require.True(t, ok, "the log's header is valid")
	frameSize := int64(walFrameHeaderSize + pageSize)
	for off := int64(walHeaderSize); off+frameSize <= int64(len(b)); off += frameSize {
		offsets = append(offsets, off)
		current = append(current, string(b[off+8:off+16]) == string(b[16:24]))
	}
	return pageSize, offsets, current
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	fh, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	defer fh.Close()
	b := make([]byte, 1)
	_, err = fh.ReadAt(b, off)
	require.NoError(t, err)
	b[0] ^= 0x10
	_, err = fh.WriteAt(b, off)
	require.NoError(t, err)
}

func TestOpenRefusesAWriteAheadLogSQLiteWouldCutShort(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		// backfill copies every frame into the file before the image is
		// taken, as the store's passive checkpoints do.
		backfill bool
		damage   func(t *testing.T, walPath string)
		damaged  bool
	}{
		{name: "an intact log", damage: func(*testing.T, string) {}},
		{name: "a frame in the middle", damaged: true, damage: func(t *testing.T, walPath string) {
			ps, offs, _ := walFrames(t, walPath)
			flipByte(t, walPath, offs[len(offs)/2]+walFrameHeaderSize+int64(ps)/2)
		}},
		{name: "a frame in the middle, after a checkpoint copied it", backfill: true, damaged: true, damage: func(t *testing.T, walPath string) {
			ps, offs, _ := walFrames(t, walPath)
			flipByte(t, walPath, offs[len(offs)/3]+walFrameHeaderSize+int64(ps)/3)
		}},
		{name: "the salt of a frame", damaged: true, damage: func(t *testing.T, walPath string) {
			_, offs, _ := walFrames(t, walPath)
			flipByte(t, walPath, offs[1]+9)
		}},
		{name: "the log's header", damaged: true, damage: func(t *testing.T, walPath string) {
			flipByte(t, walPath, 18)
		}},
		{name: "the last frame cut short by the kill", damage: func(t *testing.T, walPath string) {
			st, err := os.Stat(walPath)
			require.NoError(t, err)
			require.NoError(t, os.Truncate(walPath, st.Size()-1000))
		}},
		{name: "the last frame's page not written before the kill", damage: func(t *testing.T, walPath string) {
			ps, offs, _ := walFrames(t, walPath)
			b, err := os.ReadFile(walPath)
			require.NoError(t, err)
			last := offs[len(offs)-1] + walFrameHeaderSize
			copy(b[last:last+int64(ps)], b[offs[0]+walFrameHeaderSize:])
			require.NoError(t, os.WriteFile(walPath, b, 0o600))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFile(t)
			walEpochs(t, f, 1, 6)
			if tt.backfill {
				require.NoError(t, f.CheckpointPassive(ctx))
			}
			image := crashImage(t, f)
			tt.damage(t, image+"-wal")
			g, err := Open(ctx, image, Options{})
			if tt.damaged {
				require.ErrorIs(t, err, ErrDamaged)
				assert.Contains(t, err.Error(), "write-ahead log (image.sqlite-")
				// Nothing opened the file, so the log is as it was.
				_, statErr := os.Stat(image + "-wal")
				assert.NoError(t, statErr)
				return
			}
			require.NoError(t, err)
			defer g.Close()
			require.NoError(t, g.Verify(ctx))
			got := scanAll(t, g, ScanOptions{})
			assert.Len(t, got, 200)
		})
	}
}

func TestTheLogsIndexTellsADamagedLastFrameFromACutWrite(t *testing.T) {
	// The last frame of the log fails its check both when the kill cut
	// its write short and when it was damaged afterwards; the index the
	// killed process left (-shm) says whether its transaction committed.
	ctx := context.Background()
	tests := []struct {
		name    string
		index   bool // the -shm file is there
		damage  func(t *testing.T, walPath string)
		damaged bool
	}{
		{name: "a committed last frame damaged, with the index", index: true, damaged: true, damage: func(t *testing.T, walPath string) {
			ps, offs, _ := walFrames(t, walPath)
			flipByte(t, walPath, offs[len(offs)-1]+walFrameHeaderSize+int64(ps)/2)
		}},
		{name: "a committed last frame damaged, without the index (not seen)", damage: func(t *testing.T, walPath string) {
			ps, offs, _ := walFrames(t, walPath)
			flipByte(t, walPath, offs[len(offs)-1]+walFrameHeaderSize+int64(ps)/2)
		}},
		{name: "a frame the kill cut short after the committed ones", index: true, damage: func(t *testing.T, walPath string) {
			// The frame header written, the page not: the bytes after it
			// are whatever the file held there.
			ps, offs, _ := walFrames(t, walPath)
			b, err := os.ReadFile(walPath)
			require.NoError(t, err)
			torn := make([]byte, walFrameHeaderSize+ps)
			binary.BigEndian.PutUint32(torn, 2)
			copy(torn[8:16], b[16:24])
			copy(torn[walFrameHeaderSize:], b[offs[0]+walFrameHeaderSize:])
			require.NoError(t, os.WriteFile(walPath, append(b, torn...), 0o600))
		}},
		{name: "an intact log with its index", index: true, damage: func(*testing.T, string) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFile(t)
			walEpochs(t, f, 1, 4)
			suffixes := []string{"", "-wal"}
			if tt.index {
				suffixes = append(suffixes, "-shm")
			}
			image := crashImageOf(t, f, suffixes...)
			tt.damage(t, image+"-wal")
			g, err := Open(ctx, image, Options{})
			if tt.damaged {
				require.ErrorIs(t, err, ErrDamaged)
				assert.Contains(t, err.Error(), "-shm) says")
				return
			}
			require.NoError(t, err)
			defer g.Close()
			require.NoError(t, g.Verify(ctx))
		})
	}
}

func TestTheLogsIndexIsReadAsSQLiteWroteIt(t *testing.T) {
	// Every frame of a live file's log is committed (each Write is a
	// transaction): the index must say so, or it would witness nothing.
	f := newFile(t)
	walEpochs(t, f, 1, 3)
	b, err := os.ReadFile(f.Path() + "-wal")
	require.NoError(t, err)
	_, offs, _ := walFrames(t, f.Path()+"-wal")
	n, salts, ok := walIndexFrames(f.Path() + "-shm")
	require.True(t, ok, "the index's header checks out")
	assert.Equal(t, int64(len(offs)), n)
	assert.Equal(t, b[16:24], salts)
}

func TestAReadOnlyOpenChecksTheLogAgainstItsIndex(t *testing.T) {
	// The first connection after a kill may be a read-only one (the
	// checks at the start of a run read every store's metadata); it
	// rebuilds the index as SQLite replays the log, so it must check
	// against the index the killed process left.
	ctx := context.Background()
	f := newFile(t)
	walEpochs(t, f, 1, 4)
	image := crashImageOf(t, f, "", "-wal", "-shm")
	ps, offs, _ := walFrames(t, image+"-wal")
	flipByte(t, image+"-wal", offs[len(offs)/2]+walFrameHeaderSize+int64(ps)/2)
	_, err := Open(ctx, image, Options{ReadOnly: true})
	require.ErrorIs(t, err, ErrDamaged)
	assert.Contains(t, err.Error(), "-shm) says")
}

func TestAReadOnlyCheckBesideAWriterFindsNothing(t *testing.T) {
	// A writer appends frames, starts the log over after each passive
	// checkpoint and truncates it at others, while read-only checks read
	// it: a frame half written, a round half started or a log cut under
	// the read must not read as damage (nor as an error).
	ctx := context.Background()
	f := newFile(t)
	walEpochs(t, f, 1, 2)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := int64(3); e <= 60; e++ {
			assert.NoError(t, writeEpochs(f, e, e))
			switch e % 6 {
			case 0:
				assert.NoError(t, f.CheckpointPassive(ctx))
			case 3:
				assert.NoError(t, f.Checkpoint(ctx)) // truncates the log
			}
		}
	}()
	checks := 0
	for running := true; running; checks++ {
		select {
		case <-done:
			running = false
		default:
		}
		if !assert.NoError(t, checkWAL(f.Path(), true), "check %d", checks) {
			break
		}
	}
	<-done // the writer is done with f before the test closes it
	assert.Greater(t, checks, 5)
}

func TestOpenTakesALogThatStartedOver(t *testing.T) {
	// Once a checkpoint copied the whole log, the next transaction writes
	// the log from its start again with new salts; the frames of the
	// earlier round after the new ones stay in the file and are not
	// damage.
	ctx := context.Background()
	f := newFile(t)
	walEpochs(t, f, 1, 8)
	require.NoError(t, f.CheckpointPassive(ctx))
	walEpochs(t, f, 9, 9)
	image := crashImage(t, f)
	_, _, current := walFrames(t, image+"-wal")
	require.True(t, current[0], "the log started over")
	require.False(t, current[len(current)-1], "frames of the earlier round remain after the new ones")

	g, err := Open(ctx, image, Options{})
	require.NoError(t, err)
	defer g.Close()
	require.NoError(t, g.Verify(ctx))
	r, found, err := g.Get(ctx, "s", "k007", 0)
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, int64(9), r.Epoch)

	// A damaged frame of the new round is still found, with the old
	// round's frames after it.
	image2 := crashImage(t, f)
	ps, offs, current := walFrames(t, image2+"-wal")
	first := 0
	for current[first+1] {
		first++
	}
	require.Positive(t, first, "the new round has more than one frame")
	flipByte(t, image2+"-wal", offs[0]+walFrameHeaderSize+int64(ps)/2)
	_, err = Open(ctx, image2, Options{})
	require.ErrorIs(t, err, ErrDamaged)
}

func TestOpenReadOnlyLeavesTheLogToTheWriter(t *testing.T) {
	// A read-only open runs beside a writer whose log is growing; it does
	// not check the log (the writer's own open did).
	ctx := context.Background()
	f := newFile(t)
	walEpochs(t, f, 1, 3)
	image := crashImage(t, f)
	_, offs, _ := walFrames(t, image+"-wal")
	flipByte(t, image+"-wal", offs[len(offs)-2]+walFrameHeaderSize+7)
	g, err := Open(ctx, image, Options{ReadOnly: true})
	require.NoError(t, err)
	g.Close()
	_, err = Open(ctx, image, Options{})
	require.ErrorIs(t, err, ErrDamaged)
}

func TestWALChecksumMatchesSQLite(t *testing.T) {
	// Every frame of a log SQLite wrote checks out with walSum.
	f := newFile(t)
	walEpochs(t, f, 1, 2)
	b, err := os.ReadFile(f.Path() + "-wal")
	require.NoError(t, err)
	sum, ps, ok := walHeader(b[:walHeaderSize])
	require.True(t, ok)
	n := 0
	for off := walHeaderSize; off+walFrameHeaderSize+ps <= len(b); off += walFrameHeaderSize + ps {
		fr := b[off : off+walFrameHeaderSize+ps]
		if string(fr[8:16]) != string(b[16:24]) {
			break
		}
		sum.add(fr[:8])
		sum.add(fr[walFrameHeaderSize:])
		require.True(t, sum.matches(fr[16:24]), "frame %d", n)
		require.NotZero(t, binary.BigEndian.Uint32(fr), "page number of frame %d", n)
		n++
	}
	assert.Greater(t, n, 2)
}

func TestWALSumMatchesItsDefinitionInBothByteOrders(t *testing.T) {
	// The reference: the checksum as SQLite's file format defines it,
	// word pairs read in the order the log's magic number names.
	reference := func(order binary.ByteOrder, s0, s1 uint32, b []byte) (uint32, uint32) {
		for i := 0; i+8 <= len(b); i += 8 {
			s0 += order.Uint32(b[i:]) + s1
			s1 += order.Uint32(b[i+4:]) + s0
		}
		return s0, s1
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for _, tt := range []struct {
		name   string
		little bool
		order  binary.ByteOrder
	}{{"little-endian", true, binary.LittleEndian}, {"big-endian", false, binary.BigEndian}} {
		t.Run(tt.name, func(t *testing.T) {
			for _, n := range []int{0, 8, 24, 512, 4096} {
				b := make([]byte, n)
				for i := range b {
					b[i] = byte(rng.Uint32())
				}
				sum := walSum{s0: 11, s1: 99, little: tt.little}
				sum.add(b)
				s0, s1 := reference(tt.order, 11, 99, b)
				assert.Equal(t, [2]uint32{s0, s1}, [2]uint32{sum.s0, sum.s1}, "%d bytes", n)
			}
		})
	}
}

// BenchmarkCheckWAL measures the check of a write-ahead log a kill left
// ("check") against SQLite's own replay of the same log when a connection
// first reads the file ("replay": a read-only open, which skips the
// check, of a fresh copy of the crash image each time).
func BenchmarkCheckWAL(b *testing.B) {
	ctx := context.Background()
	f, err := Create(ctx, filepath.Join(b.TempDir(), "s.sqlite"), testMeta(), Options{})
	require.NoError(b, err)
	defer f.Close()
	for e := int64(1); e <= 20; e++ {
		rows := make([]rowbatch.Row, 0, 2000)
		for k := 0; k < 2000; k++ {
			rows = append(rows, row("s", fmt.Sprintf("k%05d", k), e, strings.Repeat("v", 100)))
		}
		_, err := f.Write(ctx, rows)
		require.NoError(b, err)
	}
	st, err := os.Stat(f.Path() + "-wal")
	require.NoError(b, err)
	b.Run("check", func(b *testing.B) {
		b.SetBytes(st.Size())
		for i := 0; i < b.N; i++ {
			require.NoError(b, checkWAL(f.Path(), false))
		}
	})
	b.Run("replay", func(b *testing.B) {
		b.SetBytes(st.Size())
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			dir := b.TempDir()
			for _, suffix := range []string{"", "-wal"} {
				data, err := os.ReadFile(f.Path() + suffix)
				require.NoError(b, err)
				require.NoError(b, os.WriteFile(filepath.Join(dir, "s.sqlite"+suffix), data, 0o600))
			}
			b.StartTimer()
			g, err := Open(ctx, filepath.Join(dir, "s.sqlite"), Options{ReadOnly: true})
			require.NoError(b, err)
			g.Close()
		}
	})
}
