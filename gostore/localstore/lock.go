package localstore

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// ErrLocked is wrapped when another process (or another open in this one)
// holds the store.
var ErrLocked = errors.New("local store is locked")

// lock is an exclusive advisory lock on a file in the store's directory,
// holding the owner's pid so a second opener can say who has it. The kernel
// drops the lock when the holder dies, so a killed worker never leaves a
// stale lock behind.
type lock struct {
	f *os.File
}

func acquireLock(path string) (*lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder := "another process"
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil {
				holder = fmt.Sprintf("process %d", pid)
			}
		}
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s holds %s; stop it or use another local state directory", ErrLocked, holder, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &lock{f: f}, nil
}

func (l *lock) release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the descriptor releases the flock
	l.f = nil
	return err
}
