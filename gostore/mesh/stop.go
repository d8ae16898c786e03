package mesh

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc"
)

// fail stops the mesh with err, unless it is stopped or closing already:
// the first failure is the one. Done closes at once; the peers are told
// why (an abort on every stream, so they stop naming the cause rather
// than a broken connection), then everything stops in the background
// (finished closes when it has).
func (m *Mesh) fail(err error) { m.stop(err, err.Error(), slog.LevelError) }

// Abort stops the mesh because this process failed for reason: queued
// frames are dropped and every peer stops at once with a *PeerLostError
// whose reason is "it stopped: " + reason. Err then wraps ErrAborted.
// It returns when everything stopped; after a failure or Close it only
// waits for that.
func (m *Mesh) Abort(reason string) {
	m.stop(errorf(ErrAborted, nil, "process %d aborted: %s", m.index, reason), reason, slog.LevelWarn)
	<-m.finished
}

func (m *Mesh) stop(err error, reason string, level slog.Level) {
	var was int32
	for {
		was = m.state.Load()
		if was == stateStopped || was == stateClosing {
			return
		}
		if m.state.CompareAndSwap(was, stateStopped) {
			break
		}
	}
	m.errMu.Lock()
	m.err = err
	m.errMu.Unlock()
	if was == stateStarting {
		level = slog.LevelDebug // Start returns the error; the caller reports it
	}
	m.log.Log(context.Background(), level, "cluster mesh stopped", "error", err)
	m.closeDone()
	m.in.stop()
	m.abortMsg = reason
	close(m.aborting)
	go m.abortAndTeardown()
}

// abortGrace bounds how long a failing process waits for its aborts to be
// written before it stops every connection.
const abortGrace = time.Second

// abortAndTeardown waits (at most abortGrace) until every served stream
// sent its abort and every sender its own, then stops everything.
func (m *Mesh) abortAndTeardown() {
	var waits []chan struct{}
	m.mu.Lock()
	for _, p := range m.remote() {
		if p.inServing != nil {
			waits = append(waits, p.inServing)
		}
		if p.outUp {
			waits = append(waits, p.sendDone)
		}
	}
	m.mu.Unlock()
	grace := time.NewTimer(abortGrace)
	defer grace.Stop()
	for _, ch := range waits {
		select {
		case <-ch:
		case <-grace.C:
			m.teardown(false)
			return
		}
	}
	m.teardown(true)
}

func (m *Mesh) closeDone() { m.doneOnce.Do(func() { close(m.done) }) }

// teardown stops the server and every connection and waits for every
// goroutine. graceful lets the server finish answering what it was
// answering (the goodbyes of Close) for a moment first.
func (m *Mesh) teardown(graceful bool) {
	m.teardownOnce.Do(func() {
		m.cancel()
		m.in.stop()
		if m.srv != nil {
			if graceful {
				stopped := make(chan struct{})
				go func() { m.srv.GracefulStop(); close(stopped) }()
				select {
				case <-stopped:
				case <-time.After(time.Second):
					m.srv.Stop()
					<-stopped
				}
			} else {
				m.srv.Stop()
			}
		}
		m.mu.Lock()
		var ccs []*grpc.ClientConn
		for _, p := range m.peers {
			if p.cc != nil {
				ccs = append(ccs, p.cc)
			}
		}
		m.mu.Unlock()
		for _, cc := range ccs {
			_ = cc.Close()
		}
		m.wg.Wait()
		close(m.finished)
	})
}

// Close stops the mesh gracefully: it refuses further Sends, writes what
// is queued for every peer (waiting at most PeerTimeout in all), says
// goodbye on every stream so that the peers do not report this process
// lost, and stops everything. It returns an error naming the peers that
// did not get everything in time (frames still queued, or written but not
// read); those are not told goodbye, so they report this process lost
// rather than miss frames silently. After a failure Close only waits for the goroutines to end
// and returns nil (Err has the failure). It is idempotent.
func (m *Mesh) Close() error {
	m.closeOnce.Do(func() { m.closeErr = m.close() })
	return m.closeErr
}

func (m *Mesh) close() error {
	if !m.state.CompareAndSwap(stateRunning, stateClosing) {
		<-m.finished
		return nil
	}
	m.log.Info("closing the cluster mesh")
	for _, p := range m.peers {
		p.out.close()
	}
	close(m.flushing)
	deadline := time.NewTimer(m.s.PeerTimeout)
	defer deadline.Stop()
	expired := false
	var problems []string
	var flushed []*peer
	for _, p := range m.remote() {
		if !expired {
			select {
			case <-p.outDone:
			case <-deadline.C:
				expired = true
			}
		}
		select {
		case <-p.outDone:
			flushed = append(flushed, p)
			continue
		default:
		}
		if frames, bytes := p.out.pending(); frames > 0 {
			problems = append(problems, fmt.Sprintf("%d frames (%d bytes) for process %d (%s) were not written", frames, bytes, p.index, p.addr))
		} else {
			problems = append(problems, fmt.Sprintf("process %d (%s) did not read what was written to it (its inbox is full or it is hung)", p.index, p.addr))
		}
	}
	// Goodbye on the inbound streams of the peers that got everything.
	var serving []chan struct{}
	m.mu.Lock()
	for _, p := range flushed {
		close(p.leave)
		if p.inServing != nil {
			serving = append(serving, p.inServing)
		}
	}
	m.mu.Unlock()
	grace := time.NewTimer(time.Second)
	defer grace.Stop()
	for _, ch := range serving {
		select {
		case <-ch:
		case <-grace.C:
		}
	}
	m.state.Store(stateStopped)
	m.closeDone()
	m.teardown(true)
	m.log.Info("cluster mesh closed")
	if len(problems) > 0 {
		return fmt.Errorf("closing process %d: within %s, %s", m.index, formatDuration(m.s.PeerTimeout), strings.Join(problems, "; "))
	}
	return nil
}
