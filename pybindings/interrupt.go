package main

/*
#include <stdint.h>
*/
import "C"

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
)

// Interrupts. While the flow's thread waits in a Go call (a backup request
// to an endpoint that does not answer, a commit the run waits for), Python
// cannot run its SIGINT handler: it runs between bytecodes, and the thread
// is in Go. Python's C-level handler still writes the signal number to the
// wakeup fd (signal.set_wakeup_fd), in whatever thread the signal lands.
// The engine points that fd at a pipe whose other end a goroutine here
// reads: on SIGINT or SIGTERM it cancels the context every call into the
// core runs with, so the call returns at once (its backend requests are
// cancelled, a run's waits are failed) and Python raises
// KeyboardInterrupt, or whatever its handler does.
//
// There is one set of interrupts per process, as there is one signal
// handler.

type interruptSet struct {
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelFunc
	// fired counts the interrupts so far: an error that is a cancelled
	// context is reported as an interrupt only if one happened.
	fired atomic.Int64
}

var interrupts = newInterruptSet()

func newInterruptSet() *interruptSet {
	s := &interruptSet{}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// context returns the context calls into the core start with now.
func (s *interruptSet) context() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctx
}

// fire cancels every call in flight; calls made after it get a fresh
// context (a flow that handles KeyboardInterrupt may go on).
func (s *interruptSet) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fired.Add(1)
	s.cancel()
	s.ctx, s.cancel = context.WithCancel(context.Background())
}

// interrupted reports whether an error that is a cancelled context came
// from an interrupt.
func (s *interruptSet) interrupted() bool { return s.fired.Load() > 0 }

// callCtx is the context a call into the core runs with.
func callCtx() context.Context { return interrupts.context() }

// mp_watch_interrupts reads signal numbers from fd (the read end of the
// pipe given to signal.set_wakeup_fd) until it is closed at the other end,
// and fires an interrupt for each SIGINT or SIGTERM. It takes ownership of
// fd.
//
//export mp_watch_interrupts
func mp_watch_interrupts(fd C.int) {
	f := os.NewFile(uintptr(fd), "signal wakeup pipe")
	go func() {
		defer f.Close()
		buf := make([]byte, 64)
		for {
			n, err := f.Read(buf)
			for _, b := range buf[:n] {
				if syscall.Signal(b) == syscall.SIGINT || syscall.Signal(b) == syscall.SIGTERM {
					interrupts.fire()
				}
			}
			if err != nil {
				return
			}
		}
	}()
}
