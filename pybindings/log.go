package main

/*
#include <stdlib.h>
#include "gocalls.h"
*/
import "C"

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// The Go core logs through log/slog with loggers passed in; the bindings
// pass one that reaches Python's logging. Records are only queued where
// they are logged: the goroutine that logs may hold locks of the core that
// a Python thread waits for while it holds the GIL, so taking the GIL there
// could deadlock. One forwarder goroutine, holding no lock of the core,
// takes the GIL and hands the queued records to the logger millpond.core.
//
// There is one bridge per process, as there is one Python logging module.

// maxQueued bounds the records waiting for the forwarder; beyond it they
// are counted and reported as dropped.
const maxQueued = 10000

type logRecord struct {
	level slog.Level
	text  string
	attrs []string // key, value, key, value...
}

type logBridge struct {
	level atomic.Int64 // the lowest slog level passed on

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []logRecord
	dropped int
	busy    bool // the forwarder is handing records over
	running bool
	stopped bool
	done    chan struct{}
}

var bridge = newLogBridge()

func newLogBridge() *logBridge {
	b := &logBridge{}
	b.cond = sync.NewCond(&b.mu)
	b.level.Store(int64(slog.LevelInfo))
	return b
}

// logger returns a logger that writes through the bridge.
func (b *logBridge) logger() *slog.Logger { return slog.New(&bridgeHandler{b: b}) }

func (b *logBridge) enqueue(r logRecord) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped || len(b.queue) >= maxQueued {
		b.dropped++
		return
	}
	b.queue = append(b.queue, r)
	if !b.running {
		b.running = true
		b.done = make(chan struct{})
		go b.forward(b.done)
	}
	b.cond.Broadcast()
}

func (b *logBridge) forward(done chan struct{}) {
	defer close(done)
	for {
		b.mu.Lock()
		for len(b.queue) == 0 && b.dropped == 0 && !b.stopped {
			b.cond.Wait()
		}
		if b.stopped {
			b.running = false
			b.mu.Unlock()
			return
		}
		batch, dropped := b.queue, b.dropped
		b.queue, b.dropped, b.busy = nil, 0, true
		b.mu.Unlock()
		if dropped > 0 {
			emit(logRecord{level: slog.LevelWarn,
				text: fmt.Sprintf("%d log records of the Go core were dropped: more than %d waited for Python", dropped, maxQueued)})
		}
		for _, r := range batch {
			emit(r)
		}
		b.mu.Lock()
		b.busy = false
		b.cond.Broadcast()
		b.mu.Unlock()
	}
}

func emit(r logRecord) {
	text := C.CString(r.text)
	defer C.free(unsafe.Pointer(text))
	var attrs *C.char
	n := 0
	if len(r.attrs) > 0 {
		joined := strings.Join(r.attrs, "\x00")
		n = len(joined)
		attrs = C.CString(joined)
		defer C.free(unsafe.Pointer(attrs))
	}
	C.mp_log_emit(C.int(pythonLevel(r.level)), text, attrs, C.size_t(n))
}

// pythonLevel maps slog's levels (DEBUG -4, INFO 0, WARN 4, ERROR 8) onto
// logging's (10, 20, 30, 40), and the levels between onto levels between.
func pythonLevel(l slog.Level) int {
	return max(1, 20+int(l)*5/2)
}

// slogLevel is pythonLevel's inverse, rounded down: the lowest slog level
// whose records a Python level lets through.
func slogLevel(py int) slog.Level {
	n := (py - 20) * 2
	if n < 0 {
		return slog.Level(-((-n + 4) / 5))
	}
	return slog.Level((n + 4) / 5)
}

// flush waits until every record queued so far was handed to Python, or
// timeout passed.
func (b *logBridge) flush(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() {
		b.mu.Lock()
		b.cond.Broadcast()
		b.mu.Unlock()
	})
	defer timer.Stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.running && (len(b.queue) > 0 || b.dropped > 0 || b.busy) && time.Now().Before(deadline) {
		b.cond.Wait()
	}
}

// stop hands the queued records over and ends the forwarder for good:
// Python is shutting down, and no goroutine may take the GIL after that.
func (b *logBridge) stop(timeout time.Duration) {
	b.flush(timeout)
	b.mu.Lock()
	b.stopped = true
	done := b.done
	b.cond.Broadcast()
	b.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-time.After(timeout):
		}
	}
}

//export mp_log_flush
func mp_log_flush() { bridge.flush(5 * time.Second) }

//export mp_log_stop
func mp_log_stop() { bridge.stop(5 * time.Second) }

//export mp_log_set_level
func mp_log_set_level(pyLevel C.int) { bridge.level.Store(int64(slogLevel(int(pyLevel)))) }

// bridgeHandler is the slog.Handler of the bridge: it renders each record
// as "message key=value ..." and keeps the attributes apart as well.
type bridgeHandler struct {
	b      *logBridge
	attrs  []string // rendered attributes of With, key and value
	prefix string   // the open groups of WithGroup, "a.b."
}

func (h *bridgeHandler) Enabled(_ context.Context, l slog.Level) bool {
	return int64(l) >= h.b.level.Load()
}

func (h *bridgeHandler) Handle(_ context.Context, r slog.Record) error {
	attrs := append([]string(nil), h.attrs...)
	r.Attrs(func(a slog.Attr) bool {
		attrs = appendAttr(attrs, h.prefix, a)
		return true
	})
	var text strings.Builder
	text.WriteString(r.Message)
	for i := 0; i+1 < len(attrs); i += 2 {
		text.WriteByte(' ')
		text.WriteString(attrs[i])
		text.WriteByte('=')
		text.WriteString(quoteIfNeeded(attrs[i+1]))
	}
	h.b.enqueue(logRecord{level: r.Level, text: text.String(), attrs: attrs})
	return nil
}

func (h *bridgeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	attrs := append([]string(nil), h.attrs...)
	for _, a := range as {
		attrs = appendAttr(attrs, h.prefix, a)
	}
	return &bridgeHandler{b: h.b, attrs: attrs, prefix: h.prefix}
}

func (h *bridgeHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &bridgeHandler{b: h.b, attrs: h.attrs, prefix: h.prefix + name + "."}
}

// appendAttr renders a (group members flattened as "group.key"), skipping
// empty attributes as slog's handlers do.
func appendAttr(out []string, prefix string, a slog.Attr) []string {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return out
	}
	if a.Value.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += a.Key + "."
		}
		for _, m := range a.Value.Group() {
			out = appendAttr(out, p, m)
		}
		return out
	}
	return append(out, prefix+a.Key, a.Value.String())
}

func quoteIfNeeded(s string) string {
	if s == "" || strings.ContainsAny(s, " \t\n\"=") || !strconv.CanBackquote(s) {
		return strconv.Quote(s)
	}
	return s
}
